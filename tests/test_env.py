"""The pinned environment is consistent."""
import subprocess
import sys


def test_pip_check_is_clean():
    res = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    print(res.stdout, res.stderr)
    assert res.returncode == 0 and "No broken requirements found" in res.stdout
