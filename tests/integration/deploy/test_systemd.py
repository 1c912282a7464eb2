"""``deploy/systemd/``: the unit passes ``systemd-analyze verify`` without a warning, rates
below 5.0 ('OK') in ``systemd-analyze security``, gives the daemon time to drain its runs
before systemd's SIGKILL, and its environment file names only real settings.

``systemd-analyze`` (Debian's ``systemd`` package) reads unit files without a running systemd,
so these run in any container; ``.ci/run`` installs it where it is missing.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from triggerer.service.config import CONFIG_ENV, DaemonSettings, Settings
from triggerer.service.runs.processes import KILL_GRACE_S

SYSTEMD = Path(__file__).parents[3] / "deploy" / "systemd"
UNIT = SYSTEMD / "triggerer.service"
ENV_FILE = SYSTEMD / "triggerer.env"
INSTALLED_BIN = "/opt/triggerer/bin/triggerer"
MAX_EXPOSURE = 5.0
"""Below this, ``systemd-analyze security`` rates a unit 'OK' or better."""
EXPOSURE = re.compile(r"Overall exposure level for triggerer\.service: (\d+\.\d+) ")


def systemd_analyze(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("systemd-analyze")
    assert tool is not None, "systemd-analyze is missing: install Debian's systemd package"
    return subprocess.run(  # noqa: S603 - a fixed argv
        [tool, *arguments], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )


def unit_settings(path: Path) -> dict[str, list[str]]:
    """Each ``Key=value`` of a unit file, its values in order (keys such as ``Environment=``
    may repeat)."""
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def installable_copy(tmp_path: Path) -> Path:
    """The unit, its ``ExecStart=`` pointing at this virtualenv's ``triggerer`` instead of
    ``/opt/triggerer``'s: ``verify`` checks that the program exists."""
    here = Path(sys.executable).with_name("triggerer")
    text = UNIT.read_text()
    assert text.count(f"ExecStart={INSTALLED_BIN} ") == 1
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(f"ExecStart={INSTALLED_BIN} ", f"ExecStart={here} "))
    return copy


def test_the_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    done = systemd_analyze("verify", "--man=no", str(installable_copy(tmp_path)), cwd=tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "")


def test_the_unit_is_rated_ok_by_systemd_analyze_security(tmp_path: Path) -> None:
    # The threshold is in tenths: above 4.9 the command fails.
    done = systemd_analyze("security", "--offline=true", "--threshold=49", str(UNIT), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    found = EXPOSURE.search(done.stdout)
    assert found is not None, done.stdout
    assert float(found[1]) < MAX_EXPOSURE, done.stdout


def test_systemd_waits_for_the_runs_to_drain_before_killing() -> None:
    """Past ``shutdown_grace_s`` the daemon stops its runs' process groups, which takes up to
    ``KILL_GRACE_S``; systemd's SIGKILL must come after both."""
    settings = unit_settings(UNIT)
    assert settings["KillMode"] == ["mixed"]  # SIGTERM to the daemon alone, not to its runs
    (timeout,) = settings["TimeoutStopSec"]
    assert timeout.isdigit(), f"TimeoutStopSec={timeout}: give plain seconds"
    grace_s = DaemonSettings().shutdown_grace_s
    assert int(timeout) > grace_s + KILL_GRACE_S


def test_the_environment_names_real_settings() -> None:
    """Every ``TRIGGERER_*`` variable of the example, commented out or not, is one the daemon
    reads, and the unit's own are among them."""
    named = re.findall(r"^#?(TRIGGERER_\w+)=", ENV_FILE.read_text(), re.MULTILINE)
    for variable in named:
        if variable in ("TRIGGERER_HOME", CONFIG_ENV):
            continue
        section, key = variable.removeprefix("TRIGGERER_").lower().split("__")
        model = Settings.model_fields[section].annotation
        assert model is not None
        assert key in model.model_fields, variable
    in_unit = [value.split("=")[0] for value in unit_settings(UNIT)["Environment"]]
    assert set(in_unit) <= set(named)


def test_the_user_and_its_home_are_the_state_directory() -> None:
    """The sysusers line makes the unit's user, its home the state directory, where
    ``TRIGGERER_HOME`` puts the database and the runs' folders."""
    kind, name, _id, _gecos, home = shlex.split(
        (SYSTEMD / "triggerer.sysusers").read_text(), comments=True
    )
    settings = unit_settings(UNIT)
    assert (kind, [name], [name]) == ("u", settings["User"], settings["Group"])
    (state,) = settings["StateDirectory"]
    assert home == f"/var/lib/{state}"
    assert f"TRIGGERER_HOME={home}" in settings["Environment"]
