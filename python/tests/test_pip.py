"""`pip install ./python` offline (no index) into a venv, then the installed
package runs the two-process demo (every byte checked)."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_install_offline_then_two_process_transfer(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(HERE, src, ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                    str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_INDEX"] = "1"            # offline: nothing may be fetched
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    r = subprocess.run([py, "-m", "pip", "install", "-q", str(src)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([py, "-c", "import kvxfer; print(kvxfer.__file__)"],
                       env=env, cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and str(venv) in r.stdout, r.stdout + r.stderr
    r = subprocess.run([py, "-m", "kvxfer.demo", "--mode", "read"], env=env,
                       cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "VERIFIED" in r.stdout and "PASS" in r.stdout


if subprocess.run([sys.executable, "-m", "pip", "--version"],
                  capture_output=True).returncode != 0:
    pytestmark = pytest.mark.skip(reason="pip is not installed for %s "
                                  "(CI installs python3-pip)"
                                  % sys.executable)
if "libasan" in os.environ.get("LD_PRELOAD", ""):
    # Packaging is checked by the plain build's run; the ASan run's
    # transfer tests cover the same demo (and LSan's tracer once crashed at
    # the exit of the pip-installed orchestrator here, seen 1 in 15 runs).
    pytestmark = pytest.mark.skip(reason="packaging: checked in the plain "
                                  "build")
