"""Board profiles load and validate; detection picks the right one from a model string, and the
generic fallback discovers cpufreq policies from a sysfs tree built under tmp_path."""
import dataclasses
import importlib.resources
import logging
import os
import re

import pytest
import yaml

from streamfl.dvfs.base import DvfsError
from streamfl.dvfs.fake.tree import build_tree
from streamfl.dvfs.detect import (GENERIC_CPU_TOP_W, detect_board, discover_cpufreq,
                                  match_model, read_model)
from streamfl.dvfs.profiles import (DRIVERS, METERS, PROFILE_NAMES, load_profile,
                                    load_profile_file, model_watts)
from streamfl.dvfs.utilization import power_table, training_utilization
from streamfl.errors import ConfigError

# (device-tree model string, profile). Confirmed strings first; the others are [U] variants.
MODELS = [
    ("NVIDIA Jetson Nano Developer Kit", "jetson-nano"),
    ("NVIDIA Jetson Xavier NX Developer Kit", "jetson-xavier-nx"),
    ("NVIDIA Jetson AGX Orin Developer Kit", "jetson-agx-orin"),
    ("NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super", "jetson-orin-nano-super"),
    ("NVIDIA Jetson Orin Nano Developer Kit", "jetson-orin-nano"),
    ("Raspberry Pi 4 Model B Rev 1.4", "raspberry-pi-4"),
    ("Raspberry Pi 400 Rev 1.0", "raspberry-pi-4"),
    ("Raspberry Pi Compute Module 4 Rev 1.0", "raspberry-pi-4"),
    ("Raspberry Pi 5 Model B Rev 1.0", "raspberry-pi-5"),
    ("Raspberry Pi Compute Module 5 Rev 1.0", "raspberry-pi-5"),
]

# Spot checks against the boards' published frequency tables: (profile, domain, n, top).
LADDERS = [
    ("jetson-nano", "cpu0", 15, 1479000), ("jetson-nano", "gpu", 12, 921600),
    ("jetson-xavier-nx", "cpu2", 25, 1907200), ("jetson-xavier-nx", "gpu", 14, 1109250),
    ("jetson-agx-orin", "cpu8", 29, 2201600), ("jetson-agx-orin", "gpu", 11, 1300500),
    ("jetson-orin-nano", "cpu4", 20, 1510400), ("jetson-orin-nano", "gpu", 5, 624750),
    ("raspberry-pi-4", "cpu0", 10, 1500000), ("raspberry-pi-5", "cpu0", 10, 2400000),
]


def shipped_data(name):
    """The parsed YAML of a shipped profile, to edit into broken variants."""
    return yaml.safe_load(importlib.resources.files("streamfl.boards")
                          .joinpath(name + ".yaml").read_text(encoding="utf-8"))


def write_yaml(tmp_path, data, filename="board.yaml"):
    path = tmp_path / filename
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def make_proc(tmp_path, model):
    proc = tmp_path / "proc"
    (proc / "device-tree").mkdir(parents=True)
    (proc / "device-tree" / "model").write_bytes(model.encode() + b"\x00")
    return proc


def make_policy(sysfs, number, table=None, cpuinfo=None):
    """A cpufreq policy dir with a frequency table (kernel format, trailing space) or a range."""
    policy = sysfs / "devices/system/cpu/cpufreq" / ("policy%d" % number)
    policy.mkdir(parents=True)
    if table is not None:
        (policy / "scaling_available_frequencies").write_text(
            "".join("%d " % f for f in table) + "\n")
    if cpuinfo is not None:
        (policy / "cpuinfo_min_freq").write_text("%s\n" % cpuinfo[0])
        (policy / "cpuinfo_max_freq").write_text("%s\n" % cpuinfo[1])
    return policy


# --- shipped profiles --------------------------------------------------------------------------

def test_every_shipped_yaml_is_listed():
    files = {p.name[:-5] for p in importlib.resources.files("streamfl.boards").iterdir()
             if p.name.endswith(".yaml")}
    assert files == set(PROFILE_NAMES)


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_shipped_profile_loads_and_is_consistent(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.power.meter in METERS
    assert profile.has_gpu == any(d.kind == "gpu" for d in profile.domains)
    for dom in profile.domains:
        assert list(dom.levels_khz) == sorted(set(dom.levels_khz))
        watts = profile.power_model.watts_per_level[dom.name]
        assert len(watts) == len(dom.levels_khz)
        assert list(watts) == sorted(watts)
        assert dom.driver == DRIVERS[dom.kind]
        for path in dom.paths:
            assert not path.startswith("/") and not path.startswith("sys/")
        if dom.kind == "cpu":
            # cpuN is the policy of its first CPU.
            number = re.fullmatch(r"cpu(\d+)", dom.name).group(1)
            assert dom.paths == ("devices/system/cpu/cpufreq/policy%s" % number,)
        else:
            assert all("devfreq/" in p for p in dom.paths)


@pytest.mark.parametrize("name,domain,count,top_khz", LADDERS)
def test_ladders_match_the_reference(name, domain, count, top_khz):
    levels = load_profile(name).domain(domain).levels_khz
    assert (len(levels), levels[-1]) == (count, top_khz)


def test_modeled_power_stays_plausible():
    """Everything at the top stays near the board's published budget (see each YAML)."""
    budgets = {"jetson-nano": 10, "jetson-xavier-nx": 20, "jetson-agx-orin": 60,
               "jetson-orin-nano": 15, "raspberry-pi-4": 7, "raspberry-pi-5": 8}
    for name, budget_w in budgets.items():
        profile = load_profile(name)
        top = profile.modeled_w({d.name: len(d.levels_khz) - 1 for d in profile.domains})
        low = profile.modeled_w({d.name: 0 for d in profile.domains})
        assert profile.power_model.idle_w < low < top <= budget_w, name
    orin_nano = load_profile("jetson-orin-nano")
    assert 7 <= orin_nano.modeled_w({"cpu0": 10, "cpu4": 10, "gpu": 0}) <= 9


# Cores per cpufreq policy (related_cpus): (profile, {domain: cores}).
CORES = [
    ("jetson-nano", {"cpu0": 4}), ("jetson-xavier-nx", {"cpu0": 2, "cpu2": 2, "cpu4": 2}),
    ("jetson-agx-orin", {"cpu0": 4, "cpu4": 4, "cpu8": 4}),
    ("jetson-orin-nano", {"cpu0": 4, "cpu4": 2}),
    ("jetson-orin-nano-super", {"cpu0": 4, "cpu4": 2}),
    ("raspberry-pi-4", {"cpu0": 4}), ("raspberry-pi-5", {"cpu0": 4}),
]


@pytest.mark.parametrize("name,cores", CORES)
def test_cpu_domains_carry_their_cores(name, cores):
    profile = load_profile(name)
    assert {d.name: d.cores for d in profile.domains if d.kind == "cpu"} == cores
    assert all(d.cores is None for d in profile.domains if d.kind == "gpu")


def test_training_utilization_bills_one_core_per_cluster_beside_a_gpu_and_every_core_without():
    orin = load_profile("jetson-orin-nano")
    assert training_utilization(orin) == {"cpu0": 0.25, "cpu4": 0.5, "gpu": 1.0}
    assert training_utilization(orin, gpu=0.8, cpu_with_gpu=1 / 6.0) == pytest.approx(
        {"cpu0": 1 / 6.0, "cpu4": 1 / 6.0, "gpu": 0.8})
    pi4 = load_profile("raspberry-pi-4")
    assert training_utilization(pi4) == {"cpu0": 1.0}
    assert training_utilization(pi4, cpu_with_gpu=0.25, cpu_without_gpu=0.5) == {"cpu0": 0.5}
    # A CPU domain whose cores are unknown (discovered) keeps its full-load figure.
    unknown = dataclasses.replace(orin, domains=tuple(
        dataclasses.replace(d, cores=None) if d.kind == "cpu" else d for d in orin.domains))
    assert training_utilization(unknown) == {"cpu0": 1.0, "cpu4": 1.0, "gpu": 1.0}


def test_utilized_power_weights_each_domain_and_all_ones_is_the_full_load_figure():
    orin = load_profile("jetson-orin-nano")
    watts = orin.power_model.watts_per_level
    levels = {"cpu0": 19, "cpu4": 19, "gpu": 2}
    share = training_utilization(orin)
    assert orin.utilized_w(levels, share) == pytest.approx(
        orin.power_model.idle_w + 0.25 * watts["cpu0"][19] + 0.5 * watts["cpu4"][19]
        + watts["gpu"][2])
    assert orin.utilized_w(levels, {}) == pytest.approx(orin.modeled_w(levels))
    table = power_table(orin, share)
    assert sorted(table) == ["cpu0", "cpu4", "gpu"] and len(table["gpu"]) == 5
    assert table["gpu"][2] == pytest.approx(orin.utilized_w(levels, share), abs=1e-4)
    assert list(table["gpu"]) == sorted(table["gpu"])


def test_gpu_paths_cover_both_orin_bsps():
    gpu = load_profile("jetson-agx-orin").domain("gpu")
    assert gpu.paths[0] == "devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    assert "devices/platform/17000000.ga10b/devfreq/17000000.ga10b" in gpu.paths


@pytest.mark.parametrize("variant,real_dir", [
    ("jp4", "devices/17000000.gv11b/devfreq/17000000.gv11b"),
    ("jp5", "devices/platform/17000000.gv11b/devfreq/17000000.gv11b")])
def test_xavier_nx_gpu_paths_cover_jetpack_4_and_5(tmp_path, variant, real_dir):
    """The JP4 device dir, the JP5 platform dir (which the JP4 path links to)."""
    gpu = load_profile("jetson-xavier-nx").domain("gpu")
    assert gpu.paths[:2] == ("devices/17000000.gv11b/devfreq/17000000.gv11b",
                             "devices/platform/17000000.gv11b/devfreq/17000000.gv11b")
    build_tree(tmp_path, "jetson-xavier-nx", variant)
    found = gpu.resolve(tmp_path)
    assert os.path.realpath(str(tmp_path / found)) == os.path.realpath(str(tmp_path / real_dir))
    if variant == "jp5":                  # without nvgpu's compatibility link: the JP5 path itself
        os.unlink(str(tmp_path / "devices/17000000.gv11b"))
        assert gpu.resolve(tmp_path) == real_dir


def test_resolve_picks_the_first_existing_path(tmp_path):
    gpu = load_profile("jetson-orin-nano").domain("gpu")
    assert gpu.resolve(tmp_path) is None
    (tmp_path / "devices/platform/17000000.ga10b/devfreq/17000000.ga10b").mkdir(parents=True)
    assert gpu.resolve(tmp_path) == "devices/platform/17000000.ga10b/devfreq/17000000.ga10b"
    (tmp_path / "devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu").mkdir(parents=True)
    assert gpu.resolve(tmp_path) == "devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"


def test_domain_lookup_names_the_known_ones():
    profile = load_profile("raspberry-pi-4")
    assert profile.domain("cpu0").kind == "cpu"
    with pytest.raises(KeyError, match="cpu0"):
        profile.domain("gpu")


def test_model_watts_ends_at_top_and_rises():
    watts = model_watts([100, 200, 400], 2.0)
    assert watts[-1] == 2.0 and watts[0] < watts[1] < watts[2]


def test_unknown_profile_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        load_profile("jetson-tx2")
    assert "jetson-tx2" in str(err.value) and "raspberry-pi-5" in str(err.value)


def test_user_profile_file_loads(tmp_path):
    data = shipped_data("raspberry-pi-4")
    data["name"] = "my-pi"
    profile = load_profile_file(write_yaml(tmp_path, data))
    assert profile.name == "my-pi" and profile.domain("cpu0").levels_khz[0] == 600000


# --- schema errors: each names the file and the key ----------------------------------------------

def _set(path_keys, value):
    def edit(data):
        target = data
        for key in path_keys[:-1]:
            target = target[key]
        target[path_keys[-1]] = value
    return edit


BROKEN = [
    ("unknown top key", _set(["colour"], "green"), "colour"),
    ("unknown domain key", _set(["domains", 0, "governor"], "schedutil"), "governor"),
    ("unknown power key", _set(["power", "shunt_uohm"], 5000), "shunt_uohm"),
    ("levels not ints", _set(["domains", 0, "levels_khz"], "102000 204000"), "levels_khz"),
    ("level a float", _set(["domains", 0, "levels_khz", 0], 1.5), "levels_khz"),
    ("has_gpu a string", _set(["has_gpu"], "yes"), "has_gpu"),
    ("idle_w a string", _set(["power_model", "idle_w"], "two"), "idle_w"),
    ("watts a string", _set(["power_model", "watts_per_level", "gpu", 0], "x"), "watts_per_level"),
    ("levels descend", _set(["domains", 1, "levels_khz"], [921600, 76800]), "levels_khz"),
    ("levels repeat", _set(["domains", 1, "levels_khz"], [76800, 76800]), "levels_khz"),
    ("level zero", _set(["domains", 1, "levels_khz"], [0, 76800]), "levels_khz"),
    ("no levels", _set(["domains", 1, "levels_khz"], []), "levels_khz"),
    ("too few watts", _set(["power_model", "watts_per_level", "gpu"], [1.0, 2.0]),
     "watts_per_level.gpu"),
    ("watts fall", _set(["power_model", "watts_per_level", "gpu"], [2.0] + [1.0] * 11),
     "watts_per_level.gpu"),
    ("negative watts", _set(["power_model", "watts_per_level", "gpu"], [-1.0] * 12),
     "watts_per_level.gpu"),
    ("watts for no domain", _set(["power_model", "watts_per_level", "npu"], [1.0]),
     "watts_per_level.npu"),
    ("negative idle", _set(["power_model", "idle_w"], -1), "idle_w"),
    ("unknown kind", _set(["domains", 1, "kind"], "npu"), "kind"),
    ("wrong driver", _set(["domains", 1, "driver"], "cpufreq"), "driver"),
    ("absolute path", _set(["domains", 0, "paths"], ["/sys/devices/system/cpu/cpufreq/policy0"]),
     "paths"),
    ("escaping path", _set(["domains", 0, "paths"], ["devices/../../etc"]), "paths"),
    ("no paths", _set(["domains", 0, "paths"], []), "paths"),
    ("no domain name", _set(["domains", 0, "name"], ""), "name"),
    ("duplicate domain", _set(["domains", 1, "name"], "cpu0"), "domains"),
    ("has_gpu contradicts", _set(["has_gpu"], False), "has_gpu"),
    ("unknown meter", _set(["power", "meter"], "multimeter"), "meter"),
    ("input rail not a rail", _set(["power", "input_rail"], "VDD_IN"), "input_rail"),
    ("repeated rails", _set(["power", "rails"], ["POM_5V_IN", "POM_5V_IN"]), "rails"),
    ("empty pattern", _set(["model_patterns"], [""]), "model_patterns"),
    ("no name", _set(["name"], ""), "name"),
    ("cores on a gpu", _set(["domains", 1, "cores"], 128), "cores"),
    ("no cores", _set(["domains", 0, "cores"], 0), "cores"),
    ("cores a float", _set(["domains", 0, "cores"], 2.5), "cores"),
]


@pytest.mark.parametrize("label,edit,key", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_profile_is_a_config_error_naming_file_and_key(tmp_path, label, edit, key):
    data = shipped_data("jetson-nano")
    edit(data)
    path = write_yaml(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_profile_file(path)
    assert str(path) in str(err.value)
    assert key in str(err.value)


def test_domain_without_watts_is_a_config_error(tmp_path):
    data = shipped_data("jetson-nano")
    del data["power_model"]["watts_per_level"]["gpu"]
    with pytest.raises(ConfigError, match="'gpu' has no watts"):
        load_profile_file(write_yaml(tmp_path, data))


def test_unreadable_or_malformed_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile_file(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_profile_file(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- jetson-nano\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_profile_file(listed)


# --- detection -----------------------------------------------------------------------------------

@pytest.mark.parametrize("model,expected", MODELS)
def test_detects_board_from_model_string(tmp_path, caplog, model, expected):
    caplog.set_level(logging.INFO, logger="streamfl.dvfs.detect")
    profile = detect_board(make_proc(tmp_path, model), tmp_path / "sys")
    assert profile.name == expected
    assert "detected board %s" % expected in caplog.text


def test_model_is_read_without_its_nul_and_matched_ignoring_case(tmp_path):
    assert read_model(make_proc(tmp_path, "NVIDIA Jetson Nano Developer Kit")) == \
        "NVIDIA Jetson Nano Developer Kit"
    assert match_model("nvidia jetson nano developer kit") == ("jetson-nano", "Jetson Nano")


def test_longest_pattern_wins():
    # "Jetson Orin Nano" must not be mistaken for the original Nano; a Pi 3 has no profile.
    assert match_model("NVIDIA Jetson Orin Nano Developer Kit")[0] == "jetson-orin-nano"
    assert match_model("Raspberry Pi 3 Model B Plus Rev 1.3") is None


def test_unknown_model_falls_back_to_generic_with_discovered_policies(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="streamfl.dvfs.detect")
    sysfs = tmp_path / "sys"
    make_policy(sysfs, 0, table=[408000, 1200000, 1800000])
    make_policy(sysfs, 4, table=[408000, 1200000, 2400000])
    make_policy(sysfs, 10, table=[600000, 1000000])
    (sysfs / "devices/system/cpu/cpufreq/ondemand").mkdir()   # global governor dir: not a policy
    profile = detect_board(make_proc(tmp_path, "Radxa ROCK 5B"), sysfs)
    assert profile.name == "generic-linux"
    assert [d.name for d in profile.domains] == ["cpu0", "cpu4", "cpu10"]
    assert profile.domain("cpu4").levels_khz == (408000, 1200000, 2400000)
    assert profile.domain("cpu10").paths == ("devices/system/cpu/cpufreq/policy10",)
    assert not profile.has_gpu and profile.power.meter == "modeled"
    watts = profile.power_model.watts_per_level
    assert [len(watts[d.name]) for d in profile.domains] == [3, 3, 2]
    assert sum(w[-1] for w in watts.values()) == pytest.approx(GENERIC_CPU_TOP_W, abs=0.01)
    assert "matches no board profile" in caplog.text


def test_missing_model_file_falls_back(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="streamfl.dvfs.detect")
    sysfs = tmp_path / "sys"
    make_policy(sysfs, 0, table=[800000, 1600000])
    profile = detect_board(tmp_path / "proc", sysfs)
    assert profile.name == "generic-linux"
    assert profile.domain("cpu0").levels_khz == (800000, 1600000)
    assert "no device-tree model" in caplog.text


def test_unreadable_model_file_falls_back(tmp_path):
    proc = tmp_path / "proc"
    (proc / "device-tree" / "model").mkdir(parents=True)    # reading a directory fails (EISDIR)
    assert read_model(proc) is None
    assert detect_board(proc, tmp_path / "sys").name == "generic-linux"


def test_without_frequency_table_a_100mhz_ladder_is_built(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="streamfl.dvfs.detect")
    sysfs = tmp_path / "sys"
    make_policy(sysfs, 0, cpuinfo=(400000, 1250000))    # intel_pstate: no table
    make_policy(sysfs, 1, cpuinfo=(800000, 1000000))
    domains = discover_cpufreq(sysfs)
    assert domains[0].levels_khz == (400000, 500000, 600000, 700000, 800000, 900000, 1000000,
                                     1100000, 1200000, 1250000)
    assert domains[1].levels_khz == (800000, 900000, 1000000)
    assert "no scaling_available_frequencies" in caplog.text


def test_no_cpufreq_gives_no_domains(tmp_path):
    profile = detect_board(tmp_path / "proc", tmp_path / "sys")
    assert profile.name == "generic-linux" and profile.domains == ()
    assert profile.power_model.watts_per_level == {}


def test_policy_without_readable_files_is_skipped(tmp_path, caplog):
    sysfs = tmp_path / "sys"
    make_policy(sysfs, 0)
    make_policy(sysfs, 2, table=[1000000])
    assert [d.name for d in discover_cpufreq(sysfs)] == ["cpu2"]
    assert "skipping" in caplog.text


def test_garbage_in_cpufreq_files_is_a_dvfs_error(tmp_path):
    sysfs = tmp_path / "sys"
    policy = make_policy(sysfs, 0)
    (policy / "scaling_available_frequencies").write_text("fast slow \n")
    with pytest.raises(DvfsError, match="scaling_available_frequencies"):
        discover_cpufreq(sysfs)
    (policy / "scaling_available_frequencies").unlink()
    (policy / "cpuinfo_min_freq").write_text("2000000\n")
    (policy / "cpuinfo_max_freq").write_text("1000000\n")
    with pytest.raises(DvfsError, match="not a range"):
        discover_cpufreq(sysfs)
    (policy / "cpuinfo_max_freq").write_text("1000000 2000000\n")
    with pytest.raises(DvfsError, match="one kHz number"):
        discover_cpufreq(sysfs)


def test_rapl_zones_choose_the_rapl_meter(tmp_path):
    sysfs = tmp_path / "sys"
    make_policy(sysfs, 0, cpuinfo=(800000, 900000))
    for zone, name in [("intel-rapl:0", "package-0"), ("intel-rapl:1", "psys"),
                       ("intel-rapl:0:0", "core")]:
        (sysfs / "class/powercap" / zone).mkdir(parents=True)
        (sysfs / "class/powercap" / zone / "name").write_text(name + "\n")
    profile = detect_board(tmp_path / "proc", sysfs)
    assert profile.power.meter == "rapl"
    assert profile.power.rails == ("package-0", "psys")
