"""The scenarios of `python -m redmutex demo`, each checking its own invariant against a real
Redis: money transfers under `redis_lock` from several processes (`transfers`, the entry point
`transfers.main`), a fair lock granted in arrival order (`fair`), a semaphore holding its limit
(`semaphore`) and a cache stampede with one fill (`cache`). Not part of the library's API."""
