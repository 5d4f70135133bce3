"""bubblewrap's command line for a `SandboxPlan`, and the probe `doctor` reports.

Each mount's path is resolved through symbolic links first (bwrap would follow a link planted in a writable folder
at mount time, and a bind's target must be the real folder), and a path that does not exist is left out (binding
onto an absent path under the read-only root fails: `Can't create file … Read-only file system`). Resolution
happens here, on the host, just before the launch, from paths taskgate made or the operator configured; a link the
agent plants later is inside its own writable folders and changes nothing outside them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from taskgate.domain.sandbox import Mount, SandboxPlan

PROBE_TIMEOUT_S = 10


@dataclass(frozen=True)
class Support:
    """Whether bubblewrap can confine an agent here: `available`, the bwrap `version`, and `detail` (why not, and
    what to do)."""

    available: bool
    version: str
    detail: str


def argv(plan: SandboxPlan, inner: list[str]) -> list[str]:
    """`bwrap … -- inner…` for `plan`. The agent is pid 2 of its own pid namespace (its init, bwrap's, kills
    every leftover when the agent ends), dies with its launcher's wrapper, and has no network but loopback unless
    the plan's network is `open`."""
    args = [_bwrap(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for mount in plan.mounts:
        args += _mount_args(mount)
    # hidden folders become read-only once everything inside them is bound (bwrap made the mount points there)
    args += [arg for mount in plan.mounts if mount.how == "hide" for arg in _remount(mount)]
    if plan.network != "open":
        args.append("--unshare-net")
    if plan.catch_all:  # for the in-sandbox init's nftables rules; it drops every capability before the agent runs
        args += ["--cap-add", "CAP_NET_ADMIN"]
    # no --new-session: the agent stays in its wrapper's process group, so a stop's SIGTERM reaches it (and it
    # has no terminal to push input into: agent_exec runs in a session of its own without one, stdin /dev/null)
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    args += ["--setenv", "HOME", plan.home, "--setenv", "TMPDIR", plan.tmp, "--chdir", plan.chdir]
    return [*args, "--", *inner]


def _mount_args(mount: Mount) -> list[str]:
    path = os.path.realpath(mount.path)
    if mount.how in ("tmpfs", "hide"):
        if os.path.isdir(path):
            return ["--tmpfs", path]
        return ["--ro-bind", "/dev/null", path] if os.path.isfile(path) else []
    if mount.how == "null":
        return ["--ro-bind", "/dev/null", path] if os.path.isfile(path) else []
    source = os.path.realpath(mount.origin)
    if not os.path.exists(source):
        return []
    flag = "--bind" if mount.how == "rw" else "--ro-bind"
    return [flag, source, path]


def _remount(mount: Mount) -> list[str]:
    path = os.path.realpath(mount.path)
    return ["--remount-ro", path] if os.path.isdir(path) else []


def _bwrap() -> str:
    return shutil.which("bwrap") or "bwrap"


def probe() -> Support:
    """Run a minimal sandbox (read-only root, no network, own pid namespace) as the service's user: the only
    reliable test (user namespaces may be off, AppArmor may forbid them, a container may lack the privileges)."""
    path = shutil.which("bwrap")
    if path is None:
        return Support(False, "", "bubblewrap is not installed: apt-get install bubblewrap (or dnf install "
                                  "bubblewrap); or set [sandbox] mode = \"off\" to run agents unconfined")  # fmt: skip
    version = _version(path)
    command = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net", "--unshare-pid",
               "--die-with-parent", "--", "true"]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Support(False, version, f"bwrap could not run: {exc}")
    if done.returncode == 0:
        return Support(True, version, f"{path} ({version}) confines agents")
    return Support(False, version, f"bwrap failed: {done.stderr.strip()[-300:]}; {_userns_advice()}")


def _version(path: str) -> str:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown version"
    return done.stdout.strip().removeprefix("bubblewrap ") or "unknown version"


def _userns_advice() -> str:
    """Why user namespaces are refused here, from the knobs distributions use, and how to allow them."""
    knobs = {
        "/proc/sys/kernel/unprivileged_userns_clone": ("0", "sysctl kernel.unprivileged_userns_clone=1"),
        "/proc/sys/user/max_user_namespaces": ("0", "sysctl user.max_user_namespaces=15000"),
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns": (
            "1", "sysctl kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile for bwrap)"),
    }  # fmt: skip
    for knob, (bad, fix) in knobs.items():
        try:
            with open(knob) as handle:
                if handle.read().strip() == bad:
                    return f"{knob} is {bad}: {fix}"
        except OSError:
            continue
    return "unprivileged user namespaces seem refused here (a container without them?): run the service where they are"


def probe_catch_all() -> str | None:
    """None when the catch-all works here (root, `ip` and `nft` with NAT in a new network namespace), else why."""
    if os.geteuid() != 0:
        return "not root: connects to unlisted addresses are refused but not recorded"
    path = shutil.which("bwrap")
    if path is None:
        return "bubblewrap is not installed"
    script = "from taskgate.infrastructure.sandbox import catchall; catchall.install_rules(9)"
    command = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
               "--cap-add", "CAP_NET_ADMIN", "--", sys.executable, "-c", script]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not probe: {exc}"
    if done.returncode == 0:
        return None
    return f"nftables in the sandbox failed ({done.stderr.strip()[-200:]}): apt-get install nftables iproute2"
