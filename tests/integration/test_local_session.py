"""What `respawn local up` leaves for other terminals, and the action lines it shows (localcloud.session)."""

from __future__ import annotations

import subprocess

from localcloud.session import Actions, action_line, read_env, remove_env, write_env


def test_the_env_file_is_sourced_by_a_shell_exactly_even_with_odd_values(tmp_path):
    env = {"RESPAWN_BUCKET": "respawn-local", "ODD": "a b'c$d"}
    path = write_env(tmp_path, env)
    out = subprocess.run(["bash", "-c", f"source {path} && printf '%s|%s' \"$RESPAWN_BUCKET\" \"$ODD\""],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout == "respawn-local|a b'c$d"
    assert read_env(tmp_path) == path.read_text()
    remove_env(tmp_path)
    assert read_env(tmp_path) is None


def test_a_local_cloud_that_stops_leaves_the_exports_of_one_started_since_in_the_same_folder(tmp_path):
    # Two `respawn local up` in one folder: the first to stop removed the other's local.env, and
    # `respawn local env` said no local cloud was up while one was.
    first = write_env(tmp_path, {"RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:1111"}).read_text()
    second = write_env(tmp_path, {"RESPAWN_COMPUTE_ENDPOINT": "http://127.0.0.1:2222"}).read_text()
    remove_env(tmp_path, first)
    assert read_env(tmp_path) == second
    remove_env(tmp_path, second)
    assert read_env(tmp_path) is None
    remove_env(tmp_path, second)  # gone already: nothing to do


def test_an_executor_line_becomes_one_action_line_and_nothing_else_does():
    line = ('2026-11-27 12:01:03,123 INFO controller.service.executor: create demo-1 in us-central1-a: done '
            '{"job": "demo", "action": "CreateInstances"}')
    assert action_line(line, "tick") == "12:01:03 tick   create demo-1 in us-central1-a: done"
    assert action_line("2026-11-27 12:01:03,123 INFO controller.service.observe: listed", "tick") is None
    assert action_line(" * Serving Flask app", "event") is None


def test_actions_follow_the_function_logs_from_now_on_whole_lines_only(tmp_path):
    old = "2026-11-27 11:00:00,000 INFO controller.service.executor: delete old-1 (orphan): done\n"
    (tmp_path / "function-tick.log").write_text(old)
    seen: list[str] = []
    actions = Actions(tmp_path, seen.append)
    actions.poll()
    assert seen == []  # what an earlier run wrote is not shown
    with (tmp_path / "function-on_object.log").open("a") as f:
        f.write("2026-11-27 12:00:01,000 WARNING controller.service.executor: create j-1 in us-central1-a: failed: x\n")
        f.write("2026-11-27 12:00:02,000 INFO controller.service.executor: status PROV")  # still being written
    actions.poll()
    assert seen == ["12:00:01 event  create j-1 in us-central1-a: failed: x"]
    with (tmp_path / "function-on_object.log").open("a") as f:
        f.write("ISIONING attempt 1 (start): done\n")
    actions.poll()
    assert seen[-1] == "12:00:02 event  status PROVISIONING attempt 1 (start): done"
