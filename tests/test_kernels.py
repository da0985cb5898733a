"""One contract suite over every implementation of the coordinator's kernels (numba's and numpy's):
the mix bit for bit numpy's, the delta's squares the float32 delta's to rounding, NaN and Inf kept."""
import numpy as np
import pytest

from streamfl.coordinator.kernels import NumpyKernels, available, default_kernels
from streamfl.coordinator.kernels.numpy_kernels import MIX_BLOCK_ELEMENTS as B

SIZES = (1, 7, B - 1, B, 2 * B + 7, 300 * 517)


@pytest.fixture(params=sorted(available()))
def kernels(request):
    return available()[request.param]()


def test_numba_is_installed_with_the_server_extra_and_is_the_default():
    # setup.py's server extra (what make venv installs) brings numba: the suite must not quietly
    # test the numpy fallback alone.
    assert sorted(available()) == ["numba", "numpy"]
    assert default_kernels().name == "numba"


@pytest.mark.parametrize("size", SIZES)
def test_mix_into_is_the_plain_float32_mix_bit_for_bit(kernels, size):
    rng = np.random.default_rng(size)
    x = rng.standard_normal(size).astype(np.float32)
    u = (x + rng.standard_normal(size) * 0.1).astype(np.float32)
    for weight in (0.6, 1.0 / 3.0, 1e-7, 1.0):
        keep, take = np.float32(1.0 - weight), np.float32(weight)
        out = np.full(size, np.nan, dtype=np.float32)
        kernels.mix_into(out, x, u, keep, take)
        want = np.multiply(x, keep, dtype=np.float32)
        want += np.multiply(u, take, dtype=np.float32)
        assert out.tobytes() == want.tobytes()


def test_mix_into_reads_read_only_inputs_such_as_a_decoded_frame(kernels):
    x = np.arange(10, dtype=np.float32)
    frame = np.ones(10, dtype=np.float32).tobytes()
    u = np.frombuffer(frame, dtype=np.float32)          # read-only, as the decoder's views are
    out = np.empty(10, dtype=np.float32)
    kernels.mix_into(out, x, u, np.float32(0.5), np.float32(0.5))
    np.testing.assert_array_equal(out, (x + 1) / 2)


@pytest.mark.parametrize("size", SIZES)
def test_delta_squares_is_the_float32_deltas_sum_of_squares(kernels, size):
    rng = np.random.default_rng(size + 1)
    b = rng.standard_normal(size).astype(np.float32)
    u = (b + rng.standard_normal(size) * 1e-3).astype(np.float32)
    d = np.subtract(u, b, dtype=np.float32).astype(np.float64)
    exact = float(np.sum(d * d))                         # the float32 delta's squares, summed in float64
    assert kernels.delta_squares(u, b) == pytest.approx(exact, rel=1e-5)


@pytest.mark.parametrize("size", SIZES)
def test_delta_and_update_squares_add_the_updates_own_to_the_same_delta(kernels, size):
    rng = np.random.default_rng(size + 2)
    b = rng.standard_normal(size).astype(np.float32)
    u = (b + rng.standard_normal(size) * 1e-2).astype(np.float32)
    delta, own = kernels.delta_and_update_squares(u, b)
    assert delta == kernels.delta_squares(u, b)
    assert own == pytest.approx(float(np.sum(u.astype(np.float64) ** 2)), rel=1e-5)


def test_delta_and_update_squares_are_finite_only_for_a_finite_update(kernels):
    b = np.zeros(100, dtype=np.float32)
    for bad in (np.nan, np.inf, -np.inf):
        u = b.copy()
        u[17] = bad
        assert not all(np.isfinite(kernels.delta_and_update_squares(u, b)))
    assert all(np.isfinite(kernels.delta_and_update_squares(b + 1, b)))


def test_delta_squares_of_an_update_equal_to_its_base_is_zero(kernels):
    b = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    assert kernels.delta_squares(b.copy(), b) == 0.0


def test_delta_squares_does_not_cancel_for_an_update_close_to_a_large_base(kernels):
    # |u|^2 - 2 u.b + |b|^2 would lose every digit here (|b|^2 ~ 1e10, the delta's ~1e-2).
    b = np.full(10000, 1000.0, dtype=np.float32)
    u = b.copy()
    u[::2] += np.float32(0.001953125)                    # 2^-9, representable next to 1000
    want = 5000 * 0.001953125 ** 2
    assert kernels.delta_squares(u, b) == pytest.approx(want, rel=1e-6)


def test_delta_squares_says_nan_and_inf(kernels):
    b = np.zeros(100, dtype=np.float32)
    u = b.copy()
    u[50] = np.nan
    assert np.isnan(kernels.delta_squares(u, b))
    u[50] = np.inf
    assert np.isinf(kernels.delta_squares(u, b))
    big = np.full(100, 1e30, dtype=np.float32)          # finite values whose squares overflow float32
    assert kernels.delta_squares(big, b) > float(np.finfo(np.float32).max)  # inf (numpy) or 1e62 (numba)


def test_the_numpy_kernels_reuse_one_buffer_that_grows_to_the_largest_tensor():
    k = NumpyKernels()
    small, large = np.ones(10, np.float32), np.ones(1000, np.float32)
    k.delta_squares(small, small * 0)
    k.delta_squares(large, large * 0)
    buffer = k._delta
    assert k.delta_squares(small, small * 0) == 10.0 and k._delta is buffer and buffer.size == 1000


def test_numba_kernels_compile_without_a_writable_cache_folder(tmp_path):
    # A read-only install under a sandboxed service: numba finds no folder to cache in and raises
    # at decoration; the kernels compile without a cache instead, with a WARNING. Faked by leaving
    # numba only its IPython cell locator (which declines a file), since this test's user may
    # write anywhere.
    import os
    import subprocess
    import sys
    script = (
        "import logging, numpy as np\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from streamfl.coordinator.kernels.numba_kernels import NumbaKernels\n"
        "x = np.arange(4, dtype=np.float32)\n"
        "out = np.empty(4, np.float32)\n"
        "NumbaKernels().mix_into(out, x, x, np.float32(0.5), np.float32(0.5))\n"
        "assert (out == x).all() and NumbaKernels().delta_squares(x, x * 0) == 14.0\n"
        "assert NumbaKernels().delta_and_update_squares(x, x * 0) == (14.0, 14.0)\n"
        "print('ok')\n")
    env = dict(os.environ, NUMBA_CACHE_LOCATOR_CLASSES="_IPythonCacheLocator")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert done.stderr.count("numba cannot cache") == 2 and "NUMBA_CACHE_DIR" in done.stderr
