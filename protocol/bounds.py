"""Ranges of the quantities several methods' payloads carry: Fisher traces and diagonals, their
sums, penalty strengths, counters. A method's own payload module declares the rest of its ranges."""
from streamfl.protocol.extras import MAX_EXACT_INT, Bound

#: A Fisher trace is a sum of squared gradients over the model: >= 0. Honest traces
#: of the models here are tens to thousands (an MLP's about 24); 1e8 leaves four orders of margin
#: and still keeps one forged trace from moving a fleet's F_G by more than that (a trace of 1e9
#: flipped a fleet's critical-period flag).
FISHER_TRACE = Bound(0.0, 1e8)
#: A Fisher diagonal element is a mean of squared gradients of one weight: >= 0; a gradient
#: element of 100 squares to 1e4, the same cap admission puts on a weight (max_abs_value 1e4).
FISHER_DIAGONAL = Bound(0.0, 1e4)
#: Sums of devices' or of periods' Fisher diagonals: 10^4 devices or
#: periods at the diagonal's cap.
FISHER_SUM = Bound(0.0, 1e8)
#: Sums of diagonal times weights (V, Q): the sum's cap times admission's weight cap (1e4), either sign.
FISHER_WEIGHT_SUM = Bound(-1e12, 1e12)
#: A penalty strength (a curvature penalty's lambda): >= 0; the defaults are 1 and 10 and
#: 1e3 already holds a model still, so 1e4 only stops a forged pull from blowing up training.
LAMBDA = Bound(0.0, 1e4)
#: Windows a device estimates a Fisher on (one backward each): at least one; a million is more
#: than a board's buffer holds, so it bounds the work a model can order.
FISHER_WINDOWS = Bound(1, 10 ** 6)
#: Versions, periods, segments, frames and the like: counters from 0, exact as JSON numbers.
COUNTER = Bound(0, MAX_EXACT_INT)
#: An admission budget alpha_n (a mean admission probability) is in (0, 1): the methods divide by
#: 1 - alpha_n and by alpha_n; within [1e-3, 0.999] neither factor exceeds 1000.
BUDGET = Bound(1e-3, 0.999)
