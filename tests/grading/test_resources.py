"""The one SIGKILL loop the grader uses for a sandbox's processes (its cgroup's, or its dedicated uid's)."""
import subprocess

from ptinternals.grading.resources import kill_until_gone


def test_kill_until_gone_kills_every_process_it_is_shown_until_none_is_left():
    children = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    rounds = []

    def alive():
        rounds.append(1)
        return [c.pid for c in children if c.poll() is None]

    kill_until_gone(alive, timeout_s=5, poll_s=0.01)
    assert [c.wait(timeout=5) for c in children] == [-9, -9] and len(rounds) >= 2
