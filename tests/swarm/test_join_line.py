"""The `To join:` line a peer prints is pasted into another shell: it must reach the terminal whole."""

from daemons import peer_config


def test_the_join_line_is_one_line_on_a_narrow_terminal(daemons, tmp_path):
    """rich wrapped it to the terminal's width: pasted, the command ran --initial-peers without its address."""
    node = daemons("first", peer_config(logging={"level": "info", "format": "rich"}), env={"COLUMNS": "80"})
    words = node.join_line()
    peer_id = node.wait_status(lambda s: s.get("peer_id"), timeout=60, what="the peer id")["peer_id"]
    assert words[-1].endswith(f"/p2p/{peer_id}"), f"the join line is cut short: {words}"
    assert words[words.index("--config") + 1] == str(node.config_path), words
    addresses = [words[i + 1] for i, word in enumerate(words) if word == "--initial-peers" and i + 1 < len(words)]
    assert len(addresses) == words.count("--initial-peers") >= 1, words
    assert all(address.endswith(f"/p2p/{peer_id}") for address in addresses), words
    assert node.terminate() == 0
