"""Unit tests (pure; no Slurm): the admin's policy.toml and `dlsub config check`."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlsub.cli.main import main
from dlsub.site_config.policy_file import PolicyFileError, Window, load_policy, parse_address, parse_policy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", ["etc/policy.toml.example", "etc/testbed/policy.toml"])
def test_shipped_policy_files_are_valid(path: str) -> None:
    policy = load_policy(REPO / path)
    assert policy.role_of("gpu") == "gpu" and policy.role_of("cpu") == "cpu"
    result = CliRunner().invoke(main, ["config", "check", str(REPO / path)])
    assert result.exit_code == 0 and ": ok: policy" in result.output


def test_agent_address_is_off_unless_set_and_takes_a_name_or_an_address() -> None:
    """Unit test, no files: the TCP listener's address in the policy."""
    assert parse_policy({}).agent_address == ""
    assert parse_policy({"agent_address": "login1:6830"}).agent_address == "login1:6830"
    assert parse_address("[::1]:6830") == ("::1", 6830) and parse_address("10.0.0.5:1") == ("10.0.0.5", 1)


@pytest.mark.parametrize("data, message", [
    ({"tick_interval": 5},
     "unknown key tick_interval; valid keys: admins, agent_address, agent_user, backfill, budgets, checkpoint_grace_s"),
    ({"moves": {"enable": True}}, "moves: unknown key enable; valid keys: enabled, min_saving_s"),
    ({"policy": "sjf"}, "unknown policy 'sjf'; valid policies: efifo, fifo, gang, goodput"),
    ({"default_mode": "asap"}, "valid modes: immediate, ideal"),
    ({"tick_interval_s": "fast"}, "tick_interval_s: expected float"),
    ({"partitions": {"gpu": {"role": "accelerator"}}}, "valid roles: gpu, cpu, dev"),
    ({"time_limits": {"continue": "yes"}}, "time_limits.continue: expected bool"),
    ({"backfill": {"window": [{"name": "n", "start": "0 25 * * *", "end": "0 7 * * *"}]}}, "not a cron expression"),
    ({"backfill": {"window": [{"name": "n", "start": "0 19 * * *"}]}}, "window\\[0\\]: missing key end"),
    ({"agent_address": "login1"}, "agent_address: 'login1': expected HOST:PORT"),
    ({"agent_address": "login1:http"}, "agent_address: 'login1:http': the port must be a number from 1 to 65535"),
    ({"agent_address": "login1:70000"}, "the port must be a number from 1 to 65535"),
    ({"agent_address": "::1:6830"}, "expected HOST:PORT.*\\[ADDR\\]:PORT"),
    ({"agent_address": "log in;1:6830"}, "expected HOST:PORT"),
    ({"agent_address": "0.0.0.0:6830"}, "name the agent's host as the other login hosts reach it"),
    ({"moves": {"plain_scripts": "never"}}, "moves.plain_scripts: 'never'; valid values: 'restart', 'wait'"),
    ({"moves": {"plain_scripts": True}}, "moves.plain_scripts: expected str"),
    ({"moves": {"restart_plain_max_s": -1}}, "moves.restart_plain_max_s: must not be negative"),
    ({"moves": {"restart_plain_max_s": "10 min"}}, "moves.restart_plain_max_s: expected float"),
    ({"moves": {"plain_grace_s": 0}}, "moves.plain_grace_s: must be positive"),
    ({"moves": {"restart_plain": 600}}, "restart_plain"),
    ({"gpu_types": {"a 100": {"cost_per_gpu_hour": 1.0}}}, "gpu_types: 'a 100'; name the kind as Slurm's GRES does"),
    ({"gpu_types": {"a100": {"cost": 1.0}}}, "gpu_types.a100: unknown key cost; valid keys: cost_per_gpu_hour"),
    ({"gpu_types": {"a100": {"cost_per_gpu_hour": -1.0}}}, "gpu_types.a100.cost_per_gpu_hour: must not be negative"),
    ({"gpu_types": ["a100"]}, "gpu_types: expected a table of GPU types"),
    ({"partitions": {"gpu": {"role": "gpu", "gpu_type": "a100;rm"}}}, "partitions.gpu.gpu_type: 'a100;rm'"),
    ({"partitions": {"gpu": {"role": "gpu", "cost_per_node_hour": -2.0}}}, "cost_per_node_hour: must not be negative"),
    ({"containers": {"environment": ["OMP_NUM_THREADS=1"]}}, "containers.environment: expected a table of NAME"),
    ({"containers": {"environment": {"1X": "1"}}}, "'1X' is not a variable's name"),
    ({"containers": {"environment": {"SLURM_CPUS_ON_NODE": "1"}}}, "'SLURM_CPUS_ON_NODE' is the node's"),
    ({"containers": {"environment": {"LD_PRELOAD": "/x.so"}}}, "'LD_PRELOAD' is the node's"),
    ({"containers": {"environment": {"PYTHONPATH": "/x"}}}, "'PYTHONPATH' is dlsub's library's and the user's"),
    ({"containers": {"environment": {"NCCL_SOCKET_IFNAME": "ib0"}}}, "set from \\[containers\\] socket_ifname"),
    ({"containers": {"environment": {"A": "1\n2"}}}, "'A' has a value that holds a line break"),
    ({"containers": {"environment": {"A": True}}}, "containers.environment.A: expected a string"),
])
def test_bad_policy_is_refused_with_the_fix(data: dict, message: str) -> None:
    with pytest.raises(PolicyFileError, match=message):
        parse_policy(data)


def test_gpu_types_are_priced_per_gpu_hour_and_partitions_may_declare_their_kind() -> None:
    """Unit test, no files: [gpu_types.NAME] and a partition's gpu_type reach the prices the site charges."""
    policy = parse_policy({"partitions": {"gpu": {"role": "gpu", "cost_per_node_hour": 8.0},
                                          "gpu-v100": {"role": "gpu", "gpu_type": "v100", "cost_per_node_hour": 6.0}},
                           "gpu_types": {"a100": {"cost_per_gpu_hour": 3.0}, "v100": {"cost_per_gpu_hour": 1.0}}})
    prices = policy.prices()
    assert prices.hourly("gpu", 1, 2, "a100") == 6.0, "two a100s at 3.0 a GPU-hour"
    assert prices.hourly("gpu-v100", 1, 4) == 4.0, "the partition's declared kind when Slurm names none"
    assert prices.hourly("gpu", 1, 2) == 8.0, "no kind known: the partition's node-hour price"
    assert prices.hourly("gpu", 2, 0, "a100") == 16.0, "no GPUs: nodes at the partition's price"
    assert parse_policy({}).prices().hourly("gpu", 1, 4, "a100") == 0.0


def test_site_variables_for_every_jobs_container() -> None:
    """Unit, pure: [containers] environment, names in order, whole numbers as TOML writes them."""
    assert parse_policy({}).containers.environment == ()
    site = parse_policy({"containers": {"environment": {"OMP_NUM_THREADS": 1, "HF_HOME": "/scratch/hf"}}})
    assert site.containers.environment == (("HF_HOME", "/scratch/hf"), ("OMP_NUM_THREADS", "1"))


def test_plain_script_keys_default_and_read() -> None:
    assert (parse_policy({}).moves.plain_scripts, parse_policy({}).moves.restart_plain_max_s) == ("restart", 600.0)
    moves = parse_policy({"moves": {"plain_scripts": "wait", "restart_plain_max_s": 0, "plain_grace_s": 30}}).moves
    assert (moves.plain_scripts, moves.restart_plain_max_s, moves.plain_grace_s) == ("wait", 0.0, 30.0)


def test_config_check_exits_2_on_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text("polcy = 'fifo'\n")
    result = CliRunner().invoke(main, ["config", "check", str(bad)])
    assert result.exit_code == 2 and "unknown key polcy" in result.output


def test_cron_weekdays_mean_what_crontab_says() -> None:
    """0 is Sunday in crontab(5); APScheduler's own parser would make it Monday."""
    window = Window("weeknights", "0 19 * * 1-5", "0 7 * * 2-6")
    saturday_noon = datetime(2026, 11, 21, 12, 0).timestamp()
    monday_21h = datetime(2026, 11, 23, 21, 0).timestamp()
    assert window.state(saturday_noon)[0] is False
    is_open, closes = window.state(monday_21h)
    assert is_open and datetime.fromtimestamp(closes) == datetime(2026, 11, 24, 7, 0)
    sunday = Window("sunday", "0 0 * * 0", "0 0 * * 1")
    assert sunday.state(datetime(2026, 11, 22, 12, 0).timestamp())[0] is True
