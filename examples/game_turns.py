"""`@locked(client, "game:{game_id}")`: one lock per game, named from the call's arguments.

    python examples/game_turns.py [REDIS_URL]

Four players (threads here; processes or machines alike) play turns in two games at once. A turn
reads the game's state from Redis, thinks, and writes it back: without the lock, turns would
overwrite each other. Turns of different games never wait for each other.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid

import redis
import redmutex

TURNS_PER_PLAYER = 5


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("REDIS_URL", "redis://127.0.0.1")
    client = redmutex.Client(url)
    conn = redis.Redis.from_url(url, decode_responses=True)
    run = uuid.uuid4().hex[:8]
    games = [f"{run}-chess", f"{run}-go"]

    @redmutex.locked(client, "game:{game_id}", ttl=10, timeout=30)
    def play_turn(game_id: str, player: str, move: int) -> None:
        state = json.loads(conn.get(f"example:game:{game_id}") or '{"moves": []}')
        time.sleep(0.01)  # thinking: the window in which an unlocked turn would be lost
        state["moves"].append([player, move])
        conn.set(f"example:game:{game_id}", json.dumps(state))

    def player(name: str) -> None:
        for move in range(TURNS_PER_PLAYER):
            for game_id in games:
                play_turn(game_id, name, move)

    threads = [threading.Thread(target=player, args=(f"p{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    counts = []
    for game_id in games:
        state = json.loads(conn.get(f"example:game:{game_id}") or '{"moves": []}')
        counts.append(len(state["moves"]))
        conn.delete(f"example:game:{game_id}")
    conn.close()
    client.close()
    expected = 4 * TURNS_PER_PLAYER
    print(f"moves recorded per game: {counts} (expected {expected} each)")
    if counts == [expected] * len(games):
        print("OK: no turn was lost")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
