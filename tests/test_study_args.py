"""The three studies refuse nonsense options in one line (exit 2) before building or writing anything."""
import os

import pytest

from tools.experiments import lr_study, study, uptrain_study

BAD = [("--lr", "nan"), ("--lr", "-1"), ("--hidden", "0"), ("--layers", "0"), ("--head-dim", "7"),
       ("--corpus-mb", "-1"), ("--corpus-mb", "inf"), ("--seq-len", "0"), ("--seeds", "-1")]


@pytest.mark.parametrize("tool", [study, uptrain_study, lr_study], ids=["study", "uptrain_study", "lr_study"])
@pytest.mark.parametrize("flag,value", BAD, ids=[f"{f}={v}" for f, v in BAD])
def test_refused_in_one_line(tool, flag, value, tmp_path, capsys):
    if flag == "--lr" and tool is lr_study:
        flag = "--rates"  # lr_study sweeps --rates instead of one --lr
    with pytest.raises(SystemExit) as e:
        tool.main([flag, value, "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    print(err[-1])
    assert e.value.code == 2 and flag in err[-1] and "Traceback" not in "\n".join(err)
    assert not os.path.exists(tmp_path / "out")


def test_uptrain_study_refuses_calibration_text_bigger_than_memory(tmp_path, capsys):
    """--calib-tokens 10**12: refused before the base trains (it trained for minutes, then drew the windows)."""
    with pytest.raises(SystemExit) as e:
        uptrain_study.main(["--calib-tokens", str(10**12), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    print(err[-1])
    assert e.value.code == 2 and "--calib-tokens 1000000000000: its calibration windows need" in err[-1]
    assert not os.path.exists(tmp_path / "out")
