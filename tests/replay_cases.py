"""Hand-made replay cases shared by the store's replay tests (component/test_kv_replay.py) and the
serving model's N-host tests (unit/test_serving_hosts.py): the same trace, hits worked out once by hand."""

from pfcxl.serving.traces import Request

# a dozen requests, one per second (so each runs alone, in order), blocks named by hand
DOZEN = [[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7], [5, 6, 8], [9], [1, 2, 4, 10], [5, 14], [1, 2, 3, 7, 11],
         [9, 12], [5, 6, 8, 13], [1, 2]]
# per host (hits, loaded from its own arena, from others'), worked out by hand in docs order:
# round-robin sends request i to host i % 3; session keys on the first block (1 -> 0, 5 -> 1, 9 -> 2);
# prefix follows the longest held prefix, ties to the host with the fewest requests (here = session)
HAND = {
    ("local", "round-robin"): [(5, 5, 0), (4, 4, 0), (2, 2, 0)],
    ("shared", "round-robin"): [(7, 5, 2), (8, 1, 7), (6, 0, 6)],
    ("local", "session"): [(14, 14, 0), (6, 6, 0), (1, 1, 0)],
    ("shared", "session"): [(14, 14, 0), (6, 6, 0), (1, 1, 0)],
    ("local", "prefix"): [(14, 14, 0), (6, 6, 0), (1, 1, 0)],
    ("shared", "prefix"): [(14, 14, 0), (6, 6, 0), (1, 1, 0)],
}


def requests(lists, step_ms=1000):
    return [Request(i * step_ms, len(b) * 512, 1, tuple(b)) for i, b in enumerate(lists)]


