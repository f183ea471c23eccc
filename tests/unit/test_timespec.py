"""Unit: Slurm time-limit parsing (pure)."""

import pytest

from dlsub.slurm_plugins.timespec import TimeSpecError, format_minutes, parse_slurm_duration, parse_time_limit


@pytest.mark.parametrize(
    "text,minutes",
    [("90", 90), ("5:30", 6), ("1:30:00", 90), ("2-00", 2880), ("1-02:03", 1563), ("1-00:00:01", 1441), ("0:59", 1)],
)
def test_parses_slurm_formats(text: str, minutes: int) -> None:
    assert parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", ["", "abc", "1h", "-5", "1:2:3:4", "0", "00:00:00", "1-", "1.5"])
def test_rejects_malformed(text: str) -> None:
    with pytest.raises(TimeSpecError, match="time limit|zero"):
        parse_time_limit(text)


def test_format_round_trips() -> None:
    assert format_minutes(90) == "01:30:00"
    assert format_minutes(2880) == "2-00:00:00"
    assert parse_time_limit(format_minutes(1563)) == 1563
    assert parse_slurm_duration("UNLIMITED") is None
    assert parse_slurm_duration("00:10:00") == 10
