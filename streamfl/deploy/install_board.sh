#!/bin/sh
# streamfl board install: the agent from an offline wheelhouse (`make dist`) into a venv, its
# service user and folders, the systemd unit and the sysfs clock access, and optionally a board kit
# (`streamfl provision`). Runs as root and never uses the network. docs/deployment.md, section 3.
#
#   sh install_board.sh --wheelhouse DIR [--kit DIR] [--prefix /opt/streamfl] [--python python3]
#                       [--system-site-packages] [--root DIR] [--no-enable]
#
# Rerunning it upgrades the agent in place and keeps /etc/streamfl and the state folder.
set -eu
# The venv and the unit files must be readable by the service user whatever root's umask is.
umask 022

PROG=install_board.sh
WHEELHOUSE=
KIT=
PREFIX=/opt/streamfl
PYTHON=python3
SYSTEM_SITE=no
ROOT=
ENABLE=yes
#: The account of the unit (User=, Group=) and of systemd/streamfl.sysusers.conf.
ACCOUNT=streamfl
STATE_DIR=/var/lib/streamfl-agent
CONF_DIR=/etc/streamfl
UNIT=streamfl-agent.service

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }

usage() {
    cat <<'EOF'
usage: sh install_board.sh --wheelhouse DIR [options]

Installs the streamfl agent on this board from a wheelhouse built by `make dist`
(dist/wheelhouse/<target>/), with no network: a venv at PREFIX/venv, the service user
streamfl, /etc/streamfl (root:streamfl 0750), /var/lib/streamfl-agent, the systemd unit
streamfl-agent.service, the tmpfiles and udev rules that let group streamfl set the clocks.

  --wheelhouse DIR         the wheelhouse for this board's OS (holds target.json)
  --kit DIR                a board kit from `streamfl provision`: its files go to /etc/streamfl/
  --prefix DIR             where the venv goes (default /opt/streamfl: PREFIX/venv)
  --python PYTHON          the interpreter the venv is made from (default python3)
  --system-site-packages   let the venv see the system's packages (a torch installed system-wide)
  --root DIR               install into a root folder (image building, tests): every path is
                           prefixed with DIR and the unit is enabled with systemctl --root
  --no-enable              install the unit but do not enable or start it
  -h, --help               this text
EOF
}

value() {  # value OPTION "$@": the option's argument, or a clear error
    if [ $# -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value (see --help)"; fi
}

# The wheelhouse's target: this interpreter must be its Python on its machine, and every file it
# lists must be intact (a copy cut short on a USB stick shows here, not halfway through pip).
TARGET_CHECK='
import hashlib, json, os, platform, sys
house = sys.argv[1]
def fail(msg):
    sys.stderr.write("install_board.sh: error: %s\n" % msg)
    sys.exit(2)
try:
    with open(os.path.join(house, "target.json")) as f:
        t = json.load(f)
except (OSError, ValueError) as exc:
    fail("cannot read %s/target.json: %s" % (house, exc))
have = "%d.%d" % sys.version_info[:2]
if t.get("python") != have:
    fail("the wheelhouse %s is for Python %s (target %s), but %s is Python %s: copy the wheelhouse made for the OS of this board (make dist TARGETS=...), or name its Python with --python" % (house, t.get("python"), t.get("target"), sys.executable, have))
machine = platform.machine()
if t.get("machine") and t["machine"] != machine:
    fail("the wheelhouse %s is for %s machines (target %s), this one is %s" % (house, t["machine"], t.get("target"), machine))
for entry in t.get("files", []):
    name = entry["name"]
    if os.path.basename(name) != name or name.startswith("."):
        fail("target.json names a file outside the wheelhouse: %r" % (name,))
    digest = hashlib.sha256()
    try:
        with open(os.path.join(house, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        fail("%s is missing from the wheelhouse (%s): copy the whole folder again" % (name, exc))
    if digest.hexdigest() != entry["sha256"]:
        fail("%s in the wheelhouse is damaged (sha256 differs from target.json): copy it again" % name)
print("target %s" % t["target"])
print("wheel %s" % t["wheel"])
print("pip_wheel %s" % t["pip_wheel"])
print("extras %s" % ",".join(t.get("extras", [])))
print("torch %s" % ("yes" if t.get("torch_included") else "no"))
print("version %s" % t.get("version", "?"))
'

# torch found, not imported (importing torch takes seconds on a board): its version, or exit 1.
FIND_TORCH='
import importlib.util, sys
if importlib.util.find_spec("torch") is None:
    sys.exit(1)
try:
    from importlib.metadata import version
    print(version("torch"))
except Exception:
    print("(version unknown)")
'

# All of it in one function, read whole before it runs: sh reads a script as it goes, and a
# wheelhouse rebuilt (or a kit rewritten) while pip runs would otherwise run half of each.
main() {
    while [ $# -gt 0 ]; do
        case $1 in
            --wheelhouse) value "$@"; WHEELHOUSE=$2; shift 2 ;;
            --wheelhouse=*) WHEELHOUSE=${1#*=}; shift ;;
            --kit) value "$@"; KIT=$2; shift 2 ;;
            --kit=*) KIT=${1#*=}; shift ;;
            --prefix) value "$@"; PREFIX=$2; shift 2 ;;
            --prefix=*) PREFIX=${1#*=}; shift ;;
            --python) value "$@"; PYTHON=$2; shift 2 ;;
            --python=*) PYTHON=${1#*=}; shift ;;
            --root) value "$@"; ROOT=$2; shift 2 ;;
            --root=*) ROOT=${1#*=}; shift ;;
            --system-site-packages) SYSTEM_SITE=yes; shift ;;
            --no-enable) ENABLE=no; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
    done

    [ "$(id -u)" = 0 ] || die "run it as root (it creates the user $ACCOUNT and installs a systemd unit): sudo sh $0 ..."
    [ -n "$WHEELHOUSE" ] || die "--wheelhouse DIR is required: the dist/wheelhouse/<target>/ folder of make dist, copied to this board"
    [ -d "$WHEELHOUSE" ] || die "no wheelhouse at $WHEELHOUSE"
    WHEELHOUSE=$(cd "$WHEELHOUSE" && pwd)
    [ -f "$WHEELHOUSE/target.json" ] || die "$WHEELHOUSE is not a streamfl wheelhouse (no target.json): build one with make dist"
    case $PREFIX in
        /*) PREFIX=$(printf '%s' "$PREFIX" | sed 's:/*$::') ;;
        *) die "--prefix must be an absolute path, not $PREFIX" ;;
    esac
    [ -n "$PREFIX" ] || die "--prefix / is not a place for a venv"
    if [ -n "$ROOT" ]; then
        [ -d "$ROOT" ] || die "--root $ROOT is not a folder"
        ROOT=$(cd "$ROOT" && pwd)
        [ "$ROOT" != / ] || ROOT=
    fi
    if [ -n "$KIT" ]; then
        [ -d "$KIT" ] || die "no kit folder at $KIT"
        KIT=$(cd "$KIT" && pwd)
    fi
    command -v "$PYTHON" >/dev/null 2>&1 || die "no Python '$PYTHON' on this board (Debian: apt install python3), or name one with --python"
    case $PYTHON in /*) ;; */*) PYTHON=$(pwd)/$PYTHON ;; esac
    # Every path is absolute now. Python runs from / from here on: started in a folder that holds a
    # streamfl/ (a clone of the repository, where a kit is often made), "python -c" would import
    # that folder instead of the package just installed.
    cd / || die "cannot change to /"

    INFO=$("$PYTHON" -I -c "$TARGET_CHECK" "$WHEELHOUSE") || exit 2
    field() { printf '%s\n' "$INFO" | sed -n "s/^$1 //p"; }
    TARGET=$(field target)
    WHEEL=$WHEELHOUSE/$(field wheel)
    PIP_WHEEL=$WHEELHOUSE/$(field pip_wheel)
    EXTRAS=$(field extras)
    TORCH_INCLUDED=$(field torch)
    say "wheelhouse $WHEELHOUSE: target $TARGET, streamfl $(field version), files intact"

    VENV=$ROOT$PREFIX/venv
    VPY=$VENV/bin/python
    # Only the wheelhouse: no index, no pip configuration file, no find-links or constraints from the
    # environment.
    unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PIP_REQUIREMENT PIP_USER PIP_TARGET PIP_PREFIX
    PIP_CONFIG_FILE=/dev/null
    PIP_DISABLE_PIP_VERSION_CHECK=1
    PIP_NO_INPUT=1
    export PIP_CONFIG_FILE PIP_DISABLE_PIP_VERSION_CHECK PIP_NO_INPUT
    pip_offline() { "$VPY" -m pip install --no-index --find-links "$WHEELHOUSE" --quiet "$@"; }

    # 1. The venv. --without-pip: Debian's python3 has no ensurepip without python3-venv; pip comes
    # from its wheel in the wheelhouse instead.
    if [ -x "$VPY" ] && "$VPY" -c 'import sys' >/dev/null 2>&1; then
        VENV_PY=$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        HOST_PY=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        [ "$VENV_PY" = "$HOST_PY" ] || die "$VENV is a Python $VENV_PY venv, $PYTHON is $HOST_PY: remove $VENV and run this again"
        say "venv $VENV exists (Python $VENV_PY): upgrading in place"
    else
        [ ! -e "$VENV" ] || { say "venv $VENV is broken: making it again"; rm -rf "$VENV"; }
        mkdir -p "$ROOT$PREFIX"
        if [ "$SYSTEM_SITE" = yes ]; then
            "$PYTHON" -m venv --without-pip --system-site-packages "$VENV" \
                || die "$PYTHON -m venv failed: this Python lacks its venv module (Debian: apt install python3-venv)"
        else
            "$PYTHON" -m venv --without-pip "$VENV" \
                || die "$PYTHON -m venv failed: this Python lacks its venv module (Debian: apt install python3-venv)"
        fi
        say "made venv $VENV"
    fi
    CFG=$VENV/pyvenv.cfg
    if [ "$SYSTEM_SITE" = yes ]; then WANT_SITE=true; else WANT_SITE=false; fi
    if ! grep -q "^include-system-site-packages = $WANT_SITE\$" "$CFG"; then
        sed "s/^include-system-site-packages = .*/include-system-site-packages = $WANT_SITE/" "$CFG" > "$CFG.new"
        mv "$CFG.new" "$CFG"
        say "venv sees the system's packages: $WANT_SITE"
    fi
    [ -f "$PIP_WHEEL" ] || die "the wheelhouse has no pip wheel ($PIP_WHEEL)"
    PIP_VERSION=$(basename "$PIP_WHEEL" | cut -d- -f2)
    if [ "$("$VPY" -m pip --version 2>/dev/null | cut -d' ' -f2)" = "$PIP_VERSION" ]; then
        say "pip $PIP_VERSION in the venv"
    else
        "$VPY" "$PIP_WHEEL/pip" install --no-index --find-links "$WHEELHOUSE" --quiet --upgrade "$PIP_WHEEL" \
            || die "could not install pip into $VENV from $PIP_WHEEL"
        say "installed pip $PIP_VERSION into the venv"
    fi

    # 2. torch: in the wheelhouse (Raspberry Pi OS, Debian), or NVIDIA's wheel dropped into it, or
    # one installed system-wide and seen through --system-site-packages (JetPack).
    if [ "$TORCH_INCLUDED" = no ]; then
        TORCH_WHEEL=
        for f in "$WHEELHOUSE"/torch-*.whl; do
            [ -f "$f" ] && TORCH_WHEEL=$f
        done
        if [ -n "$TORCH_WHEEL" ]; then
            # By its path: NVIDIA's versions (2.1.0a0+...) are pre-releases pip would not pick by name.
            pip_offline "$TORCH_WHEEL" || die "could not install $TORCH_WHEEL: is it the wheel for this JetPack and Python (docs/deployment.md, section 3)?"
            say "torch from $TORCH_WHEEL"
        elif SYSTEM_TORCH=$("$VPY" -c "$FIND_TORCH" 2>/dev/null); then
            say "torch $SYSTEM_TORCH from the system's packages"
        else
            die "the $TARGET wheelhouse leaves torch out: put the torch wheel for this board (on a Jetson, NVIDIA's for its JetPack and Python) into $WHEELHOUSE, or install it system-wide and rerun with --system-site-packages (docs/deployment.md, section 3, lists the wheels)"
        fi
    fi

    # 3. streamfl and its dependencies. A rebuilt wheel of the version already installed must still
    # replace the installed code: the venv records the sha256 of the wheel it holds, and a wheel
    # other than that one is installed again.
    SPEC=$WHEEL
    [ -z "$EXTRAS" ] || SPEC="${WHEEL}[$EXTRAS]"
    MARKER=$VENV/.streamfl-wheel
    WHEEL_SHA=$(sha256sum "$WHEEL" | cut -d' ' -f1)
    OLD_SHA=
    [ ! -f "$MARKER" ] || OLD_SHA=$(cut -d' ' -f1 "$MARKER")
    HAD_STREAMFL=no
    for f in "$VENV"/lib/python*/site-packages/streamfl-*.dist-info; do
        [ ! -d "$f" ] || HAD_STREAMFL=yes
    done
    pip_offline "$SPEC" || die "pip could not install $SPEC from the wheelhouse alone (above: what it missed)"
    if [ "$HAD_STREAMFL" = yes ] && [ "$OLD_SHA" != "$WHEEL_SHA" ]; then
        pip_offline --no-deps --force-reinstall "$WHEEL" || die "could not reinstall $WHEEL"
    fi
    printf '%s %s\n' "$WHEEL_SHA" "$(basename "$WHEEL")" > "$MARKER"
    say "installed $(basename "$WHEEL")${EXTRAS:+ with [$EXTRAS]} into $VENV"
    mkdir -p "$ROOT/usr/local/bin"
    LINK=$ROOT/usr/local/bin/streamfl-agent
    if [ -e "$LINK" ] && [ ! -L "$LINK" ]; then
        say "replacing $LINK (an earlier install outside the venv) with a link"
    fi
    ln -sfn "$PREFIX/venv/bin/streamfl-agent" "$LINK"
    say "linked /usr/local/bin/streamfl-agent -> $PREFIX/venv/bin/streamfl-agent (the unit's ExecStart)"

    # The unit files come from the package just installed, so they always match its code.
    UNITS=$("$VPY" -c 'import os, streamfl.systemd as s; print(os.path.dirname(s.__file__))') \
        || die "the installed streamfl has no streamfl.systemd (the unit files): is the wheel older than this script?"

    # 4. The service account (systemd-sysusers where present, else groupadd/useradd) and its folders.
    mkdir -p "$ROOT/etc/sysusers.d"
    install -m 0644 "$UNITS/streamfl.sysusers.conf" "$ROOT/etc/sysusers.d/streamfl.conf"
    had_user() { grep -q "^$ACCOUNT:" "$ROOT/etc/passwd" 2>/dev/null; }
    if had_user; then
        say "user $ACCOUNT exists"
    else
        if command -v systemd-sysusers >/dev/null 2>&1; then
            # From stdin: how a path argument is read under --root differs between systemd versions.
            if [ -n "$ROOT" ]; then
                systemd-sysusers --root="$ROOT" - < "$ROOT/etc/sysusers.d/streamfl.conf" \
                    || die "systemd-sysusers could not create the user $ACCOUNT (above)"
            else
                systemd-sysusers - < /etc/sysusers.d/streamfl.conf \
                    || die "systemd-sysusers could not create the user $ACCOUNT (above)"
            fi
        elif command -v useradd >/dev/null 2>&1; then
            if [ -n "$ROOT" ]; then R="--root $ROOT"; else R=; fi
            # shellcheck disable=SC2086  # R is empty or two words
            grep -q "^$ACCOUNT:" "$ROOT/etc/group" 2>/dev/null || groupadd $R --system "$ACCOUNT"
            # shellcheck disable=SC2086
            useradd $R --system --gid "$ACCOUNT" --home-dir "$STATE_DIR" --no-create-home \
                --shell /usr/sbin/nologin --comment "streamfl federated learning" "$ACCOUNT"
        else
            die "neither systemd-sysusers nor useradd is here: create the system user $ACCOUNT by hand"
        fi
        had_user || die "could not create the user $ACCOUNT"
        say "created system user and group $ACCOUNT"
    fi
    # Numbers, not names: under --root the names belong to the root's /etc/passwd, not this system's.
    ACCOUNT_UID=$(awk -F: -v n="$ACCOUNT" '$1 == n { print $3 }' "$ROOT/etc/passwd")
    ACCOUNT_GID=$(awk -F: -v n="$ACCOUNT" '$1 == n { print $3 }' "$ROOT/etc/group")
    if [ -z "$ACCOUNT_UID" ] || [ -z "$ACCOUNT_GID" ]; then die "no user or group $ACCOUNT in $ROOT/etc/passwd, $ROOT/etc/group"; fi
    mkdir -p "$ROOT$STATE_DIR" "$ROOT$CONF_DIR"
    chown "$ACCOUNT_UID:$ACCOUNT_GID" "$ROOT$STATE_DIR"
    chmod 0750 "$ROOT$STATE_DIR"
    chown "0:$ACCOUNT_GID" "$ROOT$CONF_DIR"
    chmod 0750 "$ROOT$CONF_DIR"
    say "$STATE_DIR ($ACCOUNT:$ACCOUNT 0750) and $CONF_DIR (root:$ACCOUNT 0750) ready"

    # 5. The kit: its files replace their namesakes in /etc/streamfl (others there are kept).
    # Certificates and public keys are world-readable; the YAML, keys and passwords group-only.
    if [ -n "$KIT" ]; then
        copied=0
        for f in "$KIT"/* "$KIT"/.[!.]*; do
            [ -e "$f" ] || continue
            name=$(basename "$f")
            case $name in
                install_board.sh|README*) continue ;;
            esac
            if [ ! -f "$f" ]; then
                say "kit: skipped $name (not a plain file)"
                continue
            fi
            case $name in
                *.crt|*.pub) mode=0644 ;;
                *) mode=0640 ;;
            esac
            dest=$ROOT$CONF_DIR/$name
            cp "$f" "$dest.new"
            chown "0:$ACCOUNT_GID" "$dest.new"
            chmod "$mode" "$dest.new"
            mv "$dest.new" "$dest"
            say "kit: $name -> $CONF_DIR/$name (root:$ACCOUNT $mode)"
            copied=$((copied + 1))
        done
        [ "$copied" -gt 0 ] || die "the kit $KIT holds no files to install"
        [ -f "$KIT/agent.yaml" ] || say "warning: the kit has no agent.yaml"
    fi

    # 6. The unit, and the group access to the clock files: the tmpfiles rule at boot, the udev rule
    # for devices that appear later; the unit's ReadWritePaths opens exactly those folders of /sys.
    mkdir -p "$ROOT/etc/systemd/system" "$ROOT/etc/tmpfiles.d" "$ROOT/etc/udev/rules.d"
    install -m 0644 "$UNITS/$UNIT" "$ROOT/etc/systemd/system/$UNIT"
    install -m 0644 "$UNITS/streamfl-sysfs.conf" "$ROOT/etc/tmpfiles.d/streamfl-sysfs.conf"
    install -m 0644 "$UNITS/70-streamfl-dvfs.rules" "$ROOT/etc/udev/rules.d/70-streamfl-dvfs.rules"
    say "installed /etc/systemd/system/$UNIT, /etc/tmpfiles.d/streamfl-sysfs.conf, /etc/udev/rules.d/70-streamfl-dvfs.rules"

    if [ "$ENABLE" = no ]; then
        say "not enabled (--no-enable): systemctl enable --now $UNIT when ready"
    elif [ ! -f "$ROOT$CONF_DIR/agent.yaml" ]; then
        say "not enabled: there is no $CONF_DIR/agent.yaml yet (rerun with --kit, or write it and run: systemctl enable --now $UNIT)"
    elif ! command -v systemctl >/dev/null 2>&1; then
        say "skipped enabling: no systemctl here"
    elif [ -n "$ROOT" ]; then
        systemctl --root="$ROOT" enable "$UNIT"
        say "enabled $UNIT in $ROOT; the tmpfiles and udev rules apply when it boots"
    elif [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        systemd-tmpfiles --create /etc/tmpfiles.d/streamfl-sysfs.conf || say "warning: systemd-tmpfiles reported errors (above)"
        if command -v udevadm >/dev/null 2>&1; then udevadm control --reload || true; fi
        if systemctl is-active --quiet "$UNIT"; then
            systemctl restart "$UNIT"
            say "restarted $UNIT on the new version"
        else
            systemctl enable --now "$UNIT"
            say "enabled and started $UNIT"
        fi
    else
        systemctl --root=/ enable "$UNIT"
        say "no running systemd: enabled $UNIT for the next boot (skipped: start, systemd-tmpfiles, udev reload; they happen at boot)"
    fi
    say "done: streamfl-agent in $PREFIX/venv, config $CONF_DIR, state $STATE_DIR (logs: journalctl -u ${UNIT%.service} -f)"
}

main "$@"
exit
