"""Unit (no systemd, no Slurm): the shipped systemd units (etc/systemd/) let the agent and the dashboard do
what the code does.

The units are parsed as systemd reads them (sections, ``Key=value``, later keys win) and a small model of
systemd.exec's file-system sandboxing (ProtectSystem=, ProtectHome=, ReadWritePaths=, StateDirectory=,
RuntimeDirectory=, PrivateTmp=) says whether a path is writable or readable inside the service. Against it
stand the paths the code itself names: the agent's database (agent/agent_store.py), its socket
(site_config/policy_file.py), the job mailbox it writes into job directories (agent/job_mailbox.py,
dlsub/contract.py) under a user's home or a ``$DLSUB_HOME`` on scratch, and the dashboard's reads of users'
stores (job/settings.py) and its private /tmp (dashboard/simulate.py). The model is checked against the
units as they were before issue 30 (``ProtectHome=read-only`` with ``ProtectSystem=strict`` on the agent),
so a unit that forbids the mailbox again fails here.

The last test reads a closed WAL job store from a directory its reader cannot write (what the dashboard's
``ProtectHome=read-only`` makes of a home): real SQLite, real files.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
from conftest import REPO

from dlsub.agent.agent_store import DEFAULT_DB
from dlsub.contract import AGENT_MAILBOX_DIR, BATCH_FILE
from dlsub.job.settings import HOME_DIR, STORE_FILE, Settings, store_of
from dlsub.job.user_store import JobRecord, JobStore, read_only_records
from dlsub.site_config.policy_file import AgentPolicy

UNITS = REPO / "etc" / "systemd"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections and their keys, every value in order (systemd: the last one wins)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.strip()
        while line.endswith("\\"):  # a continued line
            line = line[:-1].rstrip() + " " + next(lines, "").strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"a key outside any section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a Key=value line: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@dataclass(frozen=True)
class Sandbox:
    """What systemd.exec makes of the file system for one service (the settings dlsub's units use)."""

    protect_system: str  # no, yes/true, full, strict
    protect_home: str  # no, yes/true, read-only, tmpfs
    read_write: tuple[PurePosixPath, ...]
    private_tmp: bool

    @classmethod
    def of(cls, service: dict[str, list[str]]) -> Sandbox:
        def last(key: str, default: str) -> str:
            return service.get(key, [default])[-1].lower()

        writable = [PurePosixPath(p.lstrip("-+")) for v in service.get("ReadWritePaths", []) for p in v.split()]
        # StateDirectory=NAME is /var/lib/NAME, RuntimeDirectory=NAME /run/NAME, LogsDirectory=NAME /var/log/NAME:
        # systemd makes each and leaves it writable whatever ProtectSystem= says.
        for key, root in (("StateDirectory", "/var/lib"), ("RuntimeDirectory", "/run"), ("LogsDirectory", "/var/log")):
            writable += [PurePosixPath(root) / name for v in service.get(key, []) for name in v.split()]
        return cls(last("ProtectSystem", "no"), last("ProtectHome", "no"), tuple(writable),
                   last("PrivateTmp", "no") in ("yes", "true", "1"))

    def _home_like(self, path: PurePosixPath) -> bool:
        return any(path.is_relative_to(p) for p in ("/home", "/root", "/run/user"))

    def readable(self, path: PurePosixPath) -> bool:
        return not (self._home_like(path) and self.protect_home in ("yes", "true", "tmpfs"))

    def writable(self, path: PurePosixPath) -> bool:
        if any(path.is_relative_to(p) for p in self.read_write):
            return True
        if self.private_tmp and any(path.is_relative_to(p) for p in ("/tmp", "/var/tmp")):
            return True
        if self._home_like(path) and self.protect_home != "no":
            return False
        read_only: tuple[str, ...] = {"no": (), "yes": ("/usr", "/boot", "/efi"), "true": ("/usr", "/boot", "/efi"),
                                      "full": ("/usr", "/boot", "/efi", "/etc"), "strict": ("/",)}[self.protect_system]
        return not any(path.is_relative_to(p) for p in read_only)


def service(name: str) -> dict[str, list[str]]:
    return parse_unit((UNITS / name).read_text())["Service"]


def _mailbox(job_dirs: Path) -> PurePosixPath:
    return PurePosixPath(job_dirs / "0123abcd" / AGENT_MAILBOX_DIR / BATCH_FILE)


#: Where the agent writes in a job directory: under a user's home (the default) or a $DLSUB_HOME on scratch.
MAILBOXES = [_mailbox(Settings(home=Path("/home/alice") / HOME_DIR).jobs_dir),
             _mailbox(Settings(home=Path("/scratch/bob/dlsub")).jobs_dir)]


def test_the_unit_parser_reads_sections_keys_and_repeated_keys() -> None:
    unit = parse_unit("# c\n[Service]\nA=1\n; c\nA=2\nB=x \\\n  y\n[Install]\nWantedBy=multi-user.target\n")
    assert unit == {"Service": {"A": ["1", "2"], "B": ["x y"]}, "Install": {"WantedBy": ["multi-user.target"]}}


def test_the_model_refuses_the_mailbox_under_the_agents_old_sandbox() -> None:
    """Before issue 30 the agent's unit had these: the mailbox in a home was read-only, so was one on scratch."""
    old = Sandbox.of(parse_unit("[Service]\nProtectSystem=strict\nReadWritePaths=/var/lib/dlsub /run/dlsub\n"
                                "ProtectHome=read-only\n")["Service"])
    assert [old.writable(p) for p in MAILBOXES] == [False, False]
    assert old.writable(PurePosixPath(DEFAULT_DB))


def test_the_agent_unit_lets_it_write_every_path_the_agent_writes() -> None:
    unit = service("dlsub-agent.service")
    box = Sandbox.of(unit)
    for path in [*MAILBOXES, PurePosixPath(DEFAULT_DB), PurePosixPath(str(DEFAULT_DB) + ".lock"),
                 PurePosixPath(AgentPolicy().socket)]:
        assert box.writable(path), f"dlsub-agent.service forbids the agent to write {path}"
    # ... and still keeps the system itself read-only to it.
    assert not box.writable(PurePosixPath("/etc/dlsub/policy.toml"))
    assert not box.writable(PurePosixPath("/usr/bin/scontrol"))


def test_the_agent_unit_runs_the_service_account_with_private_state_and_a_reachable_socket() -> None:
    unit = service("dlsub-agent.service")
    policy = AgentPolicy()
    assert unit["User"][-1] == policy.agent_user
    assert [PurePosixPath("/var/lib") / unit["StateDirectory"][-1]] == [PurePosixPath(DEFAULT_DB).parent]
    assert unit["StateDirectoryMode"][-1] == "0700" and unit["UMask"][-1] == "0077"
    assert PurePosixPath("/run") / unit["RuntimeDirectory"][-1] == PurePosixPath(policy.socket).parent
    assert unit["RuntimeDirectoryMode"][-1] == "0755"  # every user reaches the socket
    start = shlex.split(unit["ExecStart"][-1])
    assert start[1:4] == ["agent", "run", "--policy"]


def test_the_dashboard_unit_reads_homes_and_has_a_private_tmp_and_writes_nothing_else() -> None:
    box = Sandbox.of(service("dlsub-dashboard.service"))
    store = PurePosixPath(store_of(Path("/home/alice")))
    assert box.readable(store)
    assert not box.writable(store)
    assert box.writable(PurePosixPath("/tmp/dlsub-dashboard-sim-x/summary.json"))
    assert box.read_write == ()


def test_the_dashboard_unit_lets_its_slurm_commands_reach_slurmctld_on_another_host() -> None:
    """Its squeue, scontrol and sacct talk to slurmctld and slurmdbd, on hosts of their own at a site (and in
    the testbed: `head`): an IPAddressDeny=any with only localhost allowed cut them off, and every page showed
    Slurm unreachable. It still listens on 127.0.0.1 only (dlsub dashboard: cli/dashboard_command.ADDRESS)."""
    from dlsub.cli.dashboard_command import ADDRESS

    unit = service("dlsub-dashboard.service")
    assert "IPAddressDeny" not in unit, unit.get("IPAddressDeny")
    assert {"AF_INET", "AF_INET6", "AF_UNIX"} <= set(" ".join(unit["RestrictAddressFamilies"]).split())
    assert ADDRESS == "127.0.0.1"


# ---------------------------------------------------------------- the dashboard's read of a store


def _read_in_child(store: Path, as_nobody: bool) -> tuple[str, str]:
    """(what SQLite's plain read-only open says, what read_only_records returns), in a forked child that
    cannot write the store's directory (root's child becomes nobody; nothing is imported after the fork)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(reader)
            if as_nobody:
                os.setgid(65534)
                os.setuid(65534)
            try:
                sqlite3.connect(f"file:{store}?mode=ro", uri=True).execute("select * from jobs").fetchall()
                plain = "read"
            except sqlite3.OperationalError as exc:
                plain = str(exc)
            try:
                records = ",".join(r.id for r in read_only_records(store))
            except sqlite3.Error as exc:
                records = f"error: {exc}"
            os.write(writer, f"{plain}\n{records}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    plain, _, records = out.partition("\n")
    return plain, records


def test_a_closed_wal_store_reads_where_its_reader_cannot_write() -> None:
    """The store's directory is not writable to the reader (as under a read-only mount): SQLite's plain
    read-only open fails there ("attempt to write a readonly database"), the records are still read, and
    nothing is created next to the store."""
    with tempfile.TemporaryDirectory() as top:  # in /tmp: reachable by nobody, unlike pytest's 0700 tmp_path
        home = Path(top) / HOME_DIR
        store = JobStore(home / STORE_FILE)
        store.add(JobRecord("0123abcd", "t", "alice", "t.py", [], str(home / "jobs" / "0123abcd"), "cpu", 0, 1, 2,
                            700, None, "img", slurm_job_id=7))
        store.close()
        assert sorted(p.name for p in home.iterdir()) == [STORE_FILE]  # the WAL files went with the last writer
        (home / STORE_FILE).chmod(0o644)
        Path(top).chmod(0o755)
        home.chmod(0o555)
        try:
            plain, records = _read_in_child(home / STORE_FILE, as_nobody=os.geteuid() == 0)
        finally:
            home.chmod(0o700)
        assert "readonly database" in plain, plain  # what the fallback is for
        assert records == "0123abcd"
        assert sorted(p.name for p in home.iterdir()) == [STORE_FILE]


def test_a_store_that_cannot_be_opened_at_all_still_fails(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError):
        read_only_records(tmp_path / "missing" / STORE_FILE)
