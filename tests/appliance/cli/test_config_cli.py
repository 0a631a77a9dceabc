"""appliance.cli.config: ``appliance config check|show`` and the --config / --override arguments."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from appliance.cli.config import add_config_arguments, config_from_args, main
from appliance.config.server_config import load_config

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "systemd" / "appliance.toml"


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_cli_arguments(tmp_path: pathlib.Path) -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    path = write(tmp_path / "a.toml", '"num.partitions" = 2\n')
    args = parser.parse_args(
        ["--config", str(path), "--override", "num.partitions=3", "--override", "node.id=4"])
    config = config_from_args(args)
    assert (config.num_partitions, config.node_id) == (3, 4)
    assert config_from_args(parser.parse_args([])).num_partitions == 1


def test_config_command(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(EXAMPLE)]) == 0
    assert "configuration OK" in capsys.readouterr().out
    assert main(["check", "--override", "segment.byte=1"]) == 1
    assert "did you mean 'segment.bytes'?" in capsys.readouterr().err
    assert main(["show", "--override", "num.partitions=9"]) == 0
    shown = write(tmp_path / "shown.toml", capsys.readouterr().out)
    assert load_config(shown).num_partitions == 9
