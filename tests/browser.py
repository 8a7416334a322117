"""Headless Chromium (Debian's `chromium`) for the tests of the web page: its command line (--dump-dom,
--screenshot), and the DevTools protocol over a pipe for what the command line cannot do (a page with JavaScript
off: --dump-dom reads the DOM with JavaScript). Every process a call starts is gone when it returns."""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMEOUT = 60  # seconds for one browser run; a page load takes 1-2 s

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage")


def chromium_binary() -> str:
    """The browser's path. Skips where it is missing, but fails under SWARMD_REQUIRE_TOOLS=1 (as CI runs)."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("SWARMD_REQUIRE_TOOLS") == "1":
        pytest.fail("chromium is required (SWARMD_REQUIRE_TOOLS=1) but missing: apt-get install chromium")
    pytest.skip("chromium is not installed (Debian package chromium)")


def chromium(profile: Path, *args: str) -> str:
    """Run the browser with `args` (e.g. --dump-dom URL); its stdout."""
    process = _start(profile, args)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    finally:
        _end(process)
    assert process.returncode == 0, f"chromium exited with {process.returncode}:\n{err[-3000:]}"
    return out


def dom_without_javascript(profile: Path, url: str) -> str:
    """The DOM of `url` loaded with JavaScript off, as the DevTools protocol serializes it."""
    theirs_in, commands = os.pipe()  # we write, the browser reads on its fd 3
    replies, theirs_out = os.pipe()  # the browser writes on its fd 4, we read
    log = profile.with_suffix(".log")  # its stderr: a file, since nothing drains a pipe while we talk
    with open(log, "w") as output:
        pipe = (theirs_in, theirs_out)
        process = _start(profile, ("--remote-debugging-pipe", "about:blank"), fds=pipe, output=output)
    os.close(theirs_in), os.close(theirs_out)
    session = _Pipe(commands, replies, time.monotonic() + TIMEOUT, log)
    try:
        target = session.call("Target.createTarget", url="about:blank")["targetId"]
        sid = session.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        session.call("Emulation.setScriptExecutionDisabled", sid, value=True)
        session.call("Page.enable", sid)
        session.call("Page.navigate", sid, url=url)
        session.wait_event("Page.loadEventFired", sid)
        root = session.call("DOM.getDocument", sid, depth=-1)["root"]["nodeId"]
        return session.call("DOM.getOuterHTML", sid, nodeId=root)["outerHTML"]
    finally:
        os.close(commands), os.close(replies)
        _end(process)


def _start(profile: Path, args, fds=(), output=subprocess.PIPE) -> subprocess.Popen:
    command = [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", *args]
    if fds:  # the protocol's pipe must be the browser's fds 3 (in) and 4 (out): a small exec moves them there
        command = [sys.executable, "-c", _AS_FDS_3_AND_4, *map(str, fds), *command]
    return subprocess.Popen(
        command, stdout=output, stderr=output, text=True, pass_fds=fds,
        start_new_session=True,  # its own process group: its helper processes end with it
    )


_AS_FDS_3_AND_4 = """
import os, sys
given = [os.dup(int(fd)) for fd in sys.argv[1:3]]  # copies first: a pipe end may itself be fd 3 or 4
for target, fd in zip((3, 4), given):
    if fd != target:
        os.dup2(fd, target)
    os.set_inheritable(target, True)  # os.dup's copies are close-on-exec, and dup2 onto itself keeps that
os.execvp(sys.argv[3], sys.argv[3:])
"""


def _end(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group this call started; a no-op once all have exited
    except ProcessLookupError:
        pass
    process.wait(timeout=10)


class _Pipe:
    """DevTools protocol messages: JSON, each ended by a NUL byte (--remote-debugging-pipe)."""

    def __init__(self, out_fd: int, in_fd: int, deadline: float, log: Path):
        self.out_fd, self.in_fd, self.deadline, self.log = out_fd, in_fd, deadline, log
        self.next_id, self.buffer, self.events = 0, b"", []

    def call(self, method: str, session_id: str = None, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session_id:
            message["sessionId"] = session_id
        os.write(self.out_fd, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session_id: str) -> None:
        while not any(e.get("method") == method and e.get("sessionId") == session_id for e in self.events):
            self.events.append(self._read())

    def _read(self) -> dict:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            assert left > 0 and select.select([self.in_fd], [], [], left)[0], f"chromium did not answer; see {self.log}"
            chunk = os.read(self.in_fd, 65536)
            assert chunk, f"chromium closed its DevTools pipe; see {self.log}"
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)
