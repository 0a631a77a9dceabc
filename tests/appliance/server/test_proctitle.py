"""appliance.server.proctitle: the names `ps` shows, checked on real child processes."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from appliance.server import proctitle

REPO = pathlib.Path(__file__).resolve().parents[3]

# The child retitles itself, reports what it set, then waits so that ps can look at it.
CHILD = """
import sys
from appliance.server import proctitle
shown = proctitle.set_proctitle(sys.argv[1], sys.argv[2] or None)
print(shown, flush=True)
sys.stdin.read()
"""
PADDING = "x" * 80  # gives the child's command line room for the titles below


def run_titled(title: str, comm: str = "") -> tuple[str, str, str, str]:
    """Start a child that sets a title; return (what it reported, ps args, ps comm, /proc comm)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, title, comm, PADDING],
                             cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        reported = child.stdout.readline().rstrip("\n")
        ps_args = subprocess.run(["ps", "-o", "args=", "-p", str(child.pid)], capture_output=True, text=True,
                                 check=True, timeout=30).stdout.rstrip("\n")
        ps_comm = subprocess.run(["ps", "-o", "comm=", "-p", str(child.pid)], capture_output=True, text=True,
                                 check=True, timeout=30).stdout.strip()
        proc_comm = proctitle.get_comm(child.pid)
        assert proctitle.get_proctitle(child.pid) == reported
    finally:
        child.communicate("", timeout=30)
    assert child.returncode == 0
    return reported, ps_args, ps_comm, proc_comm


def test_writer_title_shows_in_ps() -> None:
    reported, ps_args, ps_comm, proc_comm = run_titled("appliance: writer orders-3")
    assert reported == ps_args == "appliance: writer orders-3"
    assert ps_comm == proc_comm == "writer orders-3"


def test_explicit_command_name_is_cut_to_15_bytes() -> None:
    _, ps_args, ps_comm, proc_comm = run_titled("appliance: supervisor", "appliance-supervisor")
    assert ps_args == "appliance: supervisor"
    assert ps_comm == proc_comm == "appliance-super"


def test_title_is_cut_to_the_room_the_command_line_had() -> None:
    # the title is longer than any command line could make room for (the interpreter's path varies)
    code = "import sys\nfrom appliance.server import proctitle\ncapacity = proctitle.cmdline_capacity()\n" \
           "print(capacity)\nprint(proctitle.set_proctitle('appliance: writer ' + 'é' * capacity))\n" \
           "print(proctitle.get_proctitle())\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=30).stdout.splitlines()
    capacity, shown, read_back = int(out[0]), out[1], out[2]
    assert shown == read_back
    assert shown.startswith("appliance: writer éé")
    assert capacity - 1 <= len(shown.encode()) <= capacity  # cut between, never inside, UTF-8 sequences


def test_forked_children_retitle_themselves() -> None:
    code = (
        "import os, sys\n"
        "from appliance.server import proctitle\n"
        "proctitle.set_proctitle('appliance: supervisor')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    proctitle.set_proctitle('appliance: writer t-0')\n"
        "    os.write(1, b'%d\\n' % os.getpid())\n"
        "    sys.stdin.read()\n"
        "    os._exit(0)\n"
        "os.write(1, b'%d\\n' % os.getpid())\n"
        "os.waitpid(pid, 0)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, PADDING], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = sorted(int(parent.stdout.readline()) for _ in range(2))
        titles = {pid: (proctitle.get_proctitle(pid), proctitle.get_comm(pid)) for pid in pids}
    finally:
        parent.communicate("", timeout=30)
    assert sorted(titles.values()) == [("appliance: supervisor", "supervisor"),
                                       ("appliance: writer t-0", "writer t-0")]


def test_in_this_process() -> None:
    """Reading our own names works without changing them."""
    assert proctitle.get_proctitle() == proctitle.get_proctitle(os.getpid())
    assert proctitle.get_comm() == proctitle.get_comm(os.getpid())
    assert proctitle.cmdline_capacity() > 0
