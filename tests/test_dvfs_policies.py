"""DVFS policies: none, performance, powersave, fixed and AdaCLP's clp-aware, on a
CPU-only view (two cpufreq policies, as on an Orin Nano) and a CPU+GPU view. Pure logic, no sysfs."""
import pytest

from streamfl.dvfs.policies.base import DomainView, DvfsPolicy, PolicyInput
from streamfl.dvfs.policies.clp_aware import ClpAwarePolicy, scaled_domains
from streamfl.dvfs.policies.extremes import PerformancePolicy, PowersavePolicy
from streamfl.dvfs.policies.factory import POLICIES, make_policy, policy_options
from streamfl.dvfs.policies.fixed import FixedPolicy
from streamfl.dvfs.policies.none import NonePolicy
from streamfl.dvfs.profiles import load_profile
from streamfl.dvfs.utilization import power_table, training_utilization
from streamfl.errors import ConfigError

CPU_LEVELS = (115200, 422400, 729600, 1036800, 1344000, 1510400)
GPU_LEVELS = (306000, 408000, 510000, 612000, 714000, 816000, 918000)


def cpu_only(current=0):
    """Two cpufreq policies, as on a Jetson Orin Nano (cpu0-3, cpu4-5)."""
    return (DomainView("cpu0", "cpu", CPU_LEVELS, current),
            DomainView("cpu4", "cpu", CPU_LEVELS, current))


def cpu_gpu(current=0):
    return cpu_only(current) + (DomainView("gpu", "gpu", GPU_LEVELS, current),)


def inp(domains, critical_period=False, timings=None):
    return PolicyInput(critical_period=critical_period, domains=domains, seconds_per_sample=timings or {})


BOARDS = pytest.mark.parametrize("domains", [cpu_only(2), cpu_gpu(2)], ids=["cpu-only", "cpu+gpu"])


# --- the views -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(name="", kind="cpu", levels_khz=(1,)), "needs a name"),
    (dict(name="x", kind="npu", levels_khz=(1,)), "kind 'npu'"),
    (dict(name="x", kind="cpu", levels_khz=()), "no levels"),
    (dict(name="x", kind="cpu", levels_khz=(2, 1)), "strictly ascending"),
    (dict(name="x", kind="cpu", levels_khz=(1, 1)), "strictly ascending"),
    (dict(name="x", kind="cpu", levels_khz=(1, 2), current_level=2), "outside 0..1"),
    (dict(name="x", kind="cpu", levels_khz=(1, 2), current_level=-1), "outside 0..1"),
])
def test_domain_view_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DomainView(**kwargs)


def test_domain_view_normalises_levels_to_a_tuple():
    dom = DomainView("gpu", "gpu", [1, 2, 3], 1)
    assert dom.levels_khz == (1, 2, 3) and dom.top_level == 2


def test_policy_input_rejects_duplicates_and_bad_timings():
    with pytest.raises(ValueError, match="duplicate"):
        PolicyInput(False, (DomainView("a", "cpu", (1,)), DomainView("a", "cpu", (1,))))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite and > 0"):
            inp(cpu_only(), timings={("cpu0", 0): bad})
    view = inp(list(cpu_only()))
    assert isinstance(view.domains, tuple) and view.domain("cpu4").name == "cpu4"
    assert view.domain("gpu") is None


def test_base_observe_is_a_no_op():
    class Fixedish(DvfsPolicy):
        def plan(self, inp):
            return {}
    Fixedish().observe("cpu0", 0, 1.0)


# --- none, performance, powersave ------------------------------------------------------------

@BOARDS
def test_none_touches_nothing(domains):
    assert NonePolicy().plan(inp(domains)) == {}
    assert NonePolicy().plan(inp(domains, critical_period=True)) == {}


@BOARDS
def test_performance_sets_every_domain_to_its_top(domains):
    plan = PerformancePolicy().plan(inp(domains))
    assert plan == {d.name: len(d.levels_khz) - 1 for d in domains}


@BOARDS
def test_powersave_sets_every_domain_to_zero(domains):
    assert PowersavePolicy().plan(inp(domains, critical_period=True)) == {d.name: 0 for d in domains}


# --- fixed -----------------------------------------------------------------------------------

def test_fixed_by_index_on_cpu_only():
    assert FixedPolicy(levels={"cpu0": 3}).plan(inp(cpu_only())) == {"cpu0": 3}


def test_fixed_by_index_and_khz_on_cpu_gpu():
    policy = FixedPolicy(levels={"cpu0": 0, "cpu4": 5}, levels_khz={"gpu": 612000})
    assert policy.plan(inp(cpu_gpu())) == {"cpu0": 0, "cpu4": 5, "gpu": 3}


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "set levels"),
    (dict(levels={}, levels_khz={}), "set levels"),
    (dict(levels={"cpu0": 1}, levels_khz={"cpu0": 115200}), "cpu0 given in both"),
    (dict(levels=[("cpu0", 1)]), "must map domain names"),
    (dict(levels={"": 1}), "bad domain name"),
    (dict(levels={3: 1}), "bad domain name"),
    (dict(levels={"cpu0": "3"}), r"levels\[cpu0\] must be an integer"),
    (dict(levels={"cpu0": 1.0}), r"levels\[cpu0\] must be an integer"),
    (dict(levels={"cpu0": True}), r"levels\[cpu0\] must be an integer"),
    (dict(levels={"cpu0": -1}), r"levels\[cpu0\] must be >= 0"),
    (dict(levels_khz={"gpu": 0}), r"levels_khz\[gpu\] must be >= 1"),
])
def test_fixed_rejects_bad_configuration(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        FixedPolicy(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(levels={"gpu": 1}), "levels names domain 'gpu', this board has: cpu0, cpu4"),
    (dict(levels_khz={"gpu": 306000}), "levels_khz names domain 'gpu', this board has: cpu0, cpu4"),
    (dict(levels={"cpu4": 6}), r"levels\[cpu4\] = 6, but cpu4 has levels 0..5"),
    (dict(levels_khz={"cpu0": 1000000}), r"1000000 is not a level of cpu0 \(115200, 422400"),
])
def test_fixed_rejects_what_the_board_lacks(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        FixedPolicy(**kwargs).plan(inp(cpu_only()))


# --- clp-aware -------------------------------------------------------------------------------

#: Seconds per sample at each GPU level: steps save 25%, 20%, 12.5%, 4.8%, then under 2%.
GPU_T = (0.40, 0.30, 0.24, 0.21, 0.20, 0.197, 0.196)
CPU_T = (2.0, 1.2, 0.9, 0.8, 0.79, 0.785)


def run_rounds(policy, domains, rounds, critical_period=False, times=None, timings=None):
    """Plan ``rounds`` rounds, reporting each scaled domain's time per sample at its planned level,
    as the agent does; returns the plans."""
    times = times or {"gpu": GPU_T, "cpu0": CPU_T, "cpu4": CPU_T}
    plans = []
    for _ in range(rounds):
        plan = policy.plan(inp(domains, critical_period=critical_period, timings=timings))
        plans.append(plan)
        for name, level in plan.items():
            policy.observe(name, level, times[name][level])
    return plans


def test_scaled_domains_prefers_the_gpu():
    assert [d.name for d in scaled_domains(cpu_gpu())] == ["gpu"]
    assert [d.name for d in scaled_domains(cpu_only())] == ["cpu0", "cpu4"]
    assert scaled_domains(()) == ()


@BOARDS
def test_clp_aware_runs_lowest_during_the_clp(domains):
    policy = ClpAwarePolicy()
    plans = run_rounds(policy, domains, 5, critical_period=True)
    scaled = [d.name for d in scaled_domains(domains)]
    assert plans == [{name: 0 for name in scaled}] * 5


def test_clp_aware_scales_the_gpu_and_leaves_the_cpus_on_cpu_gpu_boards():
    policy = ClpAwarePolicy()
    plans = run_rounds(policy, cpu_gpu(4), 2, critical_period=True) + run_rounds(policy, cpu_gpu(4), 3)
    assert all(set(p) == {"gpu"} for p in plans)


def test_clp_aware_climbs_one_level_per_round_then_holds_on_the_gpu():
    policy = ClpAwarePolicy()
    run_rounds(policy, cpu_gpu(), 3, critical_period=True)
    levels = [p["gpu"] for p in run_rounds(policy, cpu_gpu(), 8)]
    # 0->1 probes (no last step); 1->2 after 25%, 2->3 after 20%, 3->4 after 12.5%; the step to 4
    # saved 4.8% < 5%, so it holds at 4 for good.
    assert levels == [1, 2, 3, 4, 4, 4, 4, 4]
    assert policy.targets == {"gpu": 4}


def test_clp_aware_climbs_every_cpu_policy_on_cpu_only_boards():
    policy = ClpAwarePolicy()
    run_rounds(policy, cpu_only(), 2, critical_period=True)
    plans = run_rounds(policy, cpu_only(), 6)
    # Steps save 40%, 25%, 11.1%, 1.25%: climb to 4, then hold.
    assert [p["cpu0"] for p in plans] == [1, 2, 3, 4, 4, 4]
    assert all(p["cpu0"] == p["cpu4"] for p in plans)


def test_clp_aware_absolute_threshold_in_seconds():
    policy = ClpAwarePolicy(threshold=0.05, saving="absolute")
    run_rounds(policy, cpu_gpu(), 1, critical_period=True)
    # Steps save 0.10, 0.06, 0.03 s: the step to 3 saved under 0.05 s, so it holds at 3.
    assert [p["gpu"] for p in run_rounds(policy, cpu_gpu(), 5)] == [1, 2, 3, 3, 3]


def test_clp_aware_zero_threshold_climbs_to_the_top_while_time_falls():
    policy = ClpAwarePolicy(threshold=0.0)
    run_rounds(policy, cpu_gpu(), 1, critical_period=True)
    assert [p["gpu"] for p in run_rounds(policy, cpu_gpu(), 8)] == [1, 2, 3, 4, 5, 6, 6, 6]


def test_clp_aware_a_renewed_clp_sends_it_back_down():
    policy = ClpAwarePolicy()
    run_rounds(policy, cpu_gpu(), 1, critical_period=True)
    run_rounds(policy, cpu_gpu(), 6)
    assert run_rounds(policy, cpu_gpu(), 2, critical_period=True) == [{"gpu": 0}, {"gpu": 0}]
    # Every level is measured now, so the second climb judges each step before taking it and
    # stops below the step that did not pay.
    assert [p["gpu"] for p in run_rounds(policy, cpu_gpu(), 5)] == [1, 2, 3, 3, 3]


def test_clp_aware_can_hold_through_a_renewed_clp():
    policy = ClpAwarePolicy(drop_on_clp=False)
    assert run_rounds(policy, cpu_gpu(5), 1, critical_period=True) == [{"gpu": 0}]
    run_rounds(policy, cpu_gpu(), 3)
    assert run_rounds(policy, cpu_gpu(), 2, critical_period=True) == [{"gpu": 3}, {"gpu": 3}]


def test_clp_aware_holds_until_a_level_is_measured():
    policy = ClpAwarePolicy()
    domains = cpu_gpu()
    # Nothing measured, nothing observed: it cannot judge a step, so it stays at the lowest level.
    assert [policy.plan(inp(domains)) for _ in range(3)] == [{"gpu": 0}] * 3
    # Level 0 gets a timing; it steps up once to measure level 1, and waits there for it.
    assert policy.plan(inp(domains, timings={("gpu", 0): 0.4})) == {"gpu": 1}
    assert policy.plan(inp(domains, timings={("gpu", 0): 0.4})) == {"gpu": 1}
    # Level 1 measured 25% faster: up again.
    policy.observe("gpu", 1, 0.3)
    assert policy.plan(inp(domains, timings={("gpu", 0): 0.4})) == {"gpu": 2}


def test_clp_aware_probes_up_when_the_last_levels_timing_is_missing():
    policy = ClpAwarePolicy(start_at_current=True)
    domains = cpu_gpu(3)
    policy.observe("gpu", 3, 0.21)
    # Level 2 was never measured, so the last step cannot be judged: step up once to learn more.
    assert policy.plan(inp(domains)) == {"gpu": 4}
    policy.observe("gpu", 4, 0.20)
    # 3 -> 4 saved 4.8%, below 5%: hold.
    assert policy.plan(inp(domains)) == {"gpu": 4}


def test_clp_aware_uses_measured_timings_from_the_input():
    # A probe profile measured every level: each step is judged before it is taken.
    timings = {("gpu", i): t for i, t in enumerate(GPU_T)}
    policy = ClpAwarePolicy()
    levels = [policy.plan(inp(cpu_gpu(), timings=timings))["gpu"] for _ in range(6)]
    assert levels == [1, 2, 3, 3, 3, 3]


def test_clp_aware_without_probing_climbs_only_on_measured_data():
    policy = ClpAwarePolicy(probe_unmeasured=False)
    timings = {("gpu", 0): 0.4, ("gpu", 1): 0.3}
    levels = [policy.plan(inp(cpu_gpu(), timings=timings))["gpu"] for _ in range(3)]
    assert levels == [1, 1, 1]


def test_clp_aware_own_observations_win_over_the_input_and_are_windowed():
    policy = ClpAwarePolicy(window=2)
    for value in (9.0, 0.5, 0.3):
        policy.observe("gpu", 0, value)
    assert policy.t_avg("gpu", 0) == pytest.approx(0.4)
    view = inp(cpu_gpu(), timings={("gpu", 0): 5.0, ("gpu", 1): 1.0})
    assert policy.t_avg("gpu", 0, view) == pytest.approx(0.4)
    assert policy.t_avg("gpu", 1, view) == 1.0
    assert policy.t_avg("gpu", 2, view) is None
    # From the policy's view level 1 is slower than level 0: the step does not pay.
    assert policy.plan(view) == {"gpu": 0}


def test_clp_aware_start_at_current_and_default_start():
    assert ClpAwarePolicy(start_at_current=True).plan(inp(cpu_only(3))) == {"cpu0": 3, "cpu4": 3}
    assert ClpAwarePolicy().plan(inp(cpu_only(3))) == {"cpu0": 0, "cpu4": 0}
    assert ClpAwarePolicy(start_at_current=True).plan(inp(cpu_only(3), critical_period=True)) == {
        "cpu0": 0, "cpu4": 0}


def test_clp_aware_one_level_domain():
    single = (DomainView("cpu0", "cpu", (1500000,)), DomainView("gpu", "gpu", (921600,)))
    policy = ClpAwarePolicy()
    times = {"gpu": (0.3,), "cpu0": (1.0,)}
    assert run_rounds(policy, single, 2, critical_period=True, times=times) == [{"gpu": 0}] * 2
    assert run_rounds(policy, single, 3, times=times) == [{"gpu": 0}] * 3


def test_clp_aware_clamps_a_target_when_the_ladder_shrinks():
    policy = ClpAwarePolicy(start_at_current=True)
    full = cpu_only() + (DomainView("gpu", "gpu", GPU_LEVELS, 6),)
    assert policy.plan(inp(full)) == {"gpu": 6}
    short = cpu_only() + (DomainView("gpu", "gpu", GPU_LEVELS[:3]),)
    assert policy.plan(inp(short)) == {"gpu": 2}


def test_clp_aware_observe_rejects_bad_timings():
    with pytest.raises(ValueError, match="finite and > 0"):
        ClpAwarePolicy().observe("gpu", 0, 0.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(saving="percent"), "saving must be one of relative, absolute"),
    (dict(threshold="5%"), "threshold must be a number"),
    (dict(threshold=True), "threshold must be a number"),
    (dict(threshold=-0.1), "threshold must be >= 0"),
    (dict(threshold=float("nan")), "threshold must be >= 0"),
    (dict(threshold=5), "relative threshold is a fraction below 1"),
    (dict(probe_unmeasured="yes"), "probe_unmeasured must be true or false"),
    (dict(drop_on_clp=1), "drop_on_clp must be true or false"),
    (dict(start_at_current=None), "start_at_current must be true or false"),
    (dict(window=0), "window must be an integer >= 1"),
    (dict(window=2.0), "window must be an integer >= 1"),
])
def test_clp_aware_rejects_bad_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ClpAwarePolicy(**kwargs)


def test_clp_aware_absolute_threshold_may_exceed_one_second():
    assert ClpAwarePolicy(threshold=2, saving="absolute").threshold == 2.0


# --- clp-aware: the energy options (clp_level, power_w, climb_energy_ratio) ----------------------

#: Board watts while training with the GPU at each of GPU_LEVELS. Compute-bound (t ~ 1/f), the
#: energy per sample W/f falls to level 3 and rises after it: 10/306 > 12/408 > 14/510 > 16/612,
#: then 19/714, 22/816, 25/918 are 1.8%, 3.1% and 4.2% above level 3's.
GPU_W = (10.0, 12.0, 14.0, 16.0, 19.0, 22.0, 25.0)
#: Compute-bound seconds per sample: every step saves 11-25%, so the paper's climb never stops.
GPU_T_BOUND = tuple(0.1 * GPU_LEVELS[-1] / f for f in GPU_LEVELS)


def efficient(**kw):
    return ClpAwarePolicy(clp_level="efficient", power_w={"gpu": GPU_W}, **kw)


def gpu_top():
    """The CPU+GPU view with every domain at its top (a board as it boots)."""
    return cpu_only(len(CPU_LEVELS) - 1) + (
        DomainView("gpu", "gpu", GPU_LEVELS, len(GPU_LEVELS) - 1),)


def test_clp_aware_defaults_are_the_papers():
    policy = ClpAwarePolicy()
    assert (policy.clp_level, policy.power_w, policy.climb_energy_ratio) == ("lowest", {}, None)


def test_clp_aware_efficient_runs_the_clp_at_the_first_energy_minimum():
    policy = efficient()
    times = {"gpu": GPU_T_BOUND}
    assert policy.efficient_level(cpu_gpu()[-1]) == 3
    assert run_rounds(policy, gpu_top(), 3, critical_period=True, times=times) == [{"gpu": 3}] * 3
    # After the CLP the climb starts from there, one level per round while it pays.
    assert [p["gpu"] for p in run_rounds(policy, cpu_gpu(), 5, times=times)] == [4, 5, 6, 6, 6]
    # A renewed CLP goes back to the efficient level, not to the lowest.
    assert run_rounds(policy, cpu_gpu(), 1, critical_period=True, times=times) == [{"gpu": 3}]
    # Without a CLP first, the climb also starts at the CLP's level.
    assert efficient().plan(inp(gpu_top())) == {"gpu": 3}


def test_clp_aware_efficient_level_follows_measured_timings():
    policy = efficient()
    # Levels 1 and 2 measured alike (memory-bound there): level 2 costs more per sample than 1.
    policy.observe("gpu", 1, 0.3)
    policy.observe("gpu", 2, 0.3)
    assert policy.efficient_level(cpu_gpu()[-1]) == 1
    assert policy.plan(inp(cpu_gpu(), critical_period=True)) == {"gpu": 1}


def test_clp_aware_efficient_on_a_real_profile_is_the_modeled_optimum():
    nano = load_profile("jetson-nano")
    share = training_utilization(nano)
    table = power_table(nano, share)
    gpu = nano.domain("gpu")
    energy = [w / f for w, f in zip(table["gpu"], gpu.levels_khz)]     # W x (t ~ 1/f)
    views = tuple(DomainView(d.name, d.kind, d.levels_khz, len(d.levels_khz) - 1)
                  for d in nano.domains)
    policy = ClpAwarePolicy(clp_level="efficient", power_w=table)
    assert policy.plan(inp(views, critical_period=True)) == {"gpu": energy.index(min(energy))}


@pytest.mark.parametrize("cap, top_reached", [(1.02, 4), (1.035, 5), (1.1, 6)])
def test_clp_aware_climb_energy_ratio_stops_the_climb(cap, top_reached):
    policy = efficient(climb_energy_ratio=cap)
    times = {"gpu": GPU_T_BOUND}
    run_rounds(policy, cpu_gpu(), 2, critical_period=True, times=times)
    levels = [p["gpu"] for p in run_rounds(policy, cpu_gpu(), 6, times=times)]
    assert levels[-1] == top_reached and levels == sorted(levels)
    # It caps the climb only: a level above the cap is not stepped down from.
    high = efficient(climb_energy_ratio=1.0, start_at_current=True)
    assert run_rounds(high, gpu_top(), 2, times=times) == [{"gpu": 6}] * 2


def test_clp_aware_climb_energy_ratio_with_the_lowest_clp_level():
    # The cap is relative to the efficient level whatever level the CLP ran at.
    policy = ClpAwarePolicy(power_w={"gpu": GPU_W}, climb_energy_ratio=1.02)
    times = {"gpu": GPU_T_BOUND}
    assert run_rounds(policy, cpu_gpu(), 1, critical_period=True, times=times) == [{"gpu": 0}]
    assert [p["gpu"] for p in run_rounds(policy, cpu_gpu(), 7, times=times)] == [
        1, 2, 3, 4, 4, 4, 4]


def test_clp_aware_power_w_must_fit_the_board():
    with pytest.raises(ConfigError, match="power_w has no watts for domain 'gpu'"):
        ClpAwarePolicy(clp_level="efficient", power_w={"cpu0": (1.0,) * 6}).plan(
            inp(cpu_gpu(), critical_period=True))
    with pytest.raises(ConfigError, match=r"power_w\[gpu\] has 3 figures for 7 levels"):
        ClpAwarePolicy(clp_level="efficient", power_w={"gpu": (1.0, 2.0, 3.0)}).plan(
            inp(cpu_gpu(), critical_period=True))
    # The paper's setting never reads it.
    assert ClpAwarePolicy(power_w={"npu": [1.0]}).plan(inp(cpu_gpu(), critical_period=True)) == {"gpu": 0}


@pytest.mark.parametrize("kwargs, match", [
    (dict(clp_level="middle"), "clp_level must be one of lowest, efficient"),
    (dict(clp_level="efficient"), "clp_level efficient needs power_w"),
    (dict(climb_energy_ratio=1.1), "climb_energy_ratio needs power_w"),
    (dict(climb_energy_ratio=0.9, power_w={"gpu": [1.0]}),
     "climb_energy_ratio must be a number >= 1"),
    (dict(climb_energy_ratio="10%", power_w={"gpu": [1.0]}), "climb_energy_ratio must be a number"),
    (dict(climb_energy_ratio=True, power_w={"gpu": [1.0]}), "climb_energy_ratio must be a number"),
    (dict(power_w=[1.0, 2.0]), "power_w must map domain names"),
    (dict(power_w={"gpu": []}), r"power_w\[gpu\] must be a list of watts"),
    (dict(power_w={"gpu": "12"}), r"power_w\[gpu\] must be a list of watts"),
    (dict(power_w={"gpu": [1.0, -2.0]}), r"power_w\[gpu\] must hold finite watts > 0"),
    (dict(power_w={"gpu": [True]}), r"power_w\[gpu\] must hold finite watts > 0"),
    (dict(power_w={"": [1.0]}), "bad domain name"),
])
def test_clp_aware_rejects_bad_energy_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ClpAwarePolicy(**kwargs)


# --- factory ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, cls", [
    ("none", NonePolicy), ("performance", PerformancePolicy), ("powersave", PowersavePolicy),
    ("clp-aware", ClpAwarePolicy),
])
def test_make_policy_builds_each_policy(name, cls):
    policy = make_policy(name)
    assert type(policy) is cls and policy.name == name


def test_make_policy_passes_options():
    fixed = make_policy("fixed", levels_khz={"gpu": 306000})
    assert fixed.plan(inp(cpu_gpu())) == {"gpu": 0}
    clp = make_policy("clp-aware", threshold=0.1, saving="relative", drop_on_clp=False)
    assert (clp.threshold, clp.drop_on_clp) == (0.1, False)
    # As YAML hands them over: lists of watts.
    clp = make_policy("clp-aware", clp_level="efficient", power_w={"gpu": list(GPU_W)},
                      climb_energy_ratio=1.1)
    assert (clp.clp_level, clp.power_w["gpu"], clp.climb_energy_ratio) == ("efficient", GPU_W, 1.1)


def test_make_policy_lists_the_valid_names_and_options():
    assert list(POLICIES) == ["none", "performance", "powersave", "fixed", "clp-aware"]
    with pytest.raises(ConfigError, match="unknown DVFS policy 'ondemand' "
                                          r"\(valid: none, performance, powersave, fixed, clp-aware\)"):
        make_policy("ondemand")
    with pytest.raises(ConfigError, match="unknown DVFS policy None"):
        make_policy(None)
    with pytest.raises(ConfigError, match=r"clp-aware: unknown option thresh \(valid: threshold, "
                                          "saving, probe_unmeasured, drop_on_clp, start_at_current, "
                                          r"window, clp_level, power_w, climb_energy_ratio\)"):
        make_policy("clp-aware", thresh=0.1)
    with pytest.raises(ConfigError, match=r"none: unknown options a, b \(valid: none\)"):
        make_policy("none", b=1, a=2)
    with pytest.raises(ConfigError, match="must be >= 0"):
        make_policy("fixed", levels={"cpu0": -2})
    assert policy_options("fixed") == ["levels", "levels_khz"]
    assert policy_options("performance") == []
