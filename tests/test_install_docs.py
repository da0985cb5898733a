"""No page sends a user to ``pip install streamfl`` (no package index has it), and the install
section names what ``make dist`` and the board install script really offer."""
import re
import subprocess

from source_tree import ROOT, source_files
from streamfl.deploy import dist

#: ``pip install streamfl``, ``pip3 install -U "streamfl[server]"``, across a line break too.
FROM_AN_INDEX = re.compile(r"""pip3?\s+install\s+(?:-\S+\s+)*["']?streamfl\b""")


def _pages():
    return {name: (ROOT / name).read_text(encoding="utf-8") for name in source_files()
            if name.endswith((".md", ".rst", ".txt")) and not name.startswith("tests/")}


def test_no_page_installs_streamfl_from_an_index():
    found = ["%s: %s" % (name, m.group(0).replace("\n", " ")) for name, text in _pages().items()
             for m in FROM_AN_INDEX.finditer(text)]
    assert found == []


def test_the_pattern_finds_what_it_must():
    for line in ("pip install streamfl", "pip install 'streamfl[server]'", 'pip3 install -U "streamfl[jetson]"',
                 "`pip install\n\"streamfl[data]\"`"):
        assert FROM_AN_INDEX.search(line), line
    for line in ('pip install -e ".[server]"', 'pip install "dist/streamfl-0.1.0-py3-none-any.whl[server]"'):
        assert not FROM_AN_INDEX.search(line), line


def test_built_wheel_names_carry_the_version_of_setup_py():
    version = re.search(r'version="([^"]+)"', (ROOT / "setup.py").read_text()).group(1)
    named = {m.group(1) for text in _pages().values()
             for m in re.finditer(r"dist/streamfl-([^-\s]+)-py3-none-any\.whl", text)}
    assert named == {version}


def _section_3():
    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    return text.split("## 3. The agent on each board", 1)[1].split("\n## 4.", 1)[0]


def test_the_install_section_names_every_target_and_option():
    section = _section_3()
    for name, target in dist.TARGETS.items():
        row = next((ln for ln in section.splitlines() if ln.startswith("| `%s`" % name)), None)
        assert row is not None, name
        assert "| %s |" % target.python in row, row
        assert ("left out" in row) == (target.torch is None), row
    usage = subprocess.run(["sh", str(ROOT / "streamfl" / "deploy" / "install_board.sh"), "--help"],
                           stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    options = sorted(set(re.findall(r"^  (--[a-z-]+)", usage, re.M)))
    assert len(options) == 7, usage
    for option in options:
        assert option in section, option
    # The JetPack table: each Jetson target's Python, an NVIDIA wheel for it, and where it lives.
    for python in ("3.8", "3.10"):
        tag = "cp%s" % python.replace(".", "")
        assert re.search(r"`torch-[^`]+-%s-%s-linux_aarch64\.whl`" % (tag, tag), section), python
    assert "developer.download.nvidia.com" in section
    assert "CAP_SYS_ADMIN" in section and "ReadWritePaths" in section
