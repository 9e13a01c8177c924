"""``python -m wangate.worker``: a worker process (wangate.workers.worker)."""

from wangate.workers.worker import main

if __name__ == "__main__":
    raise SystemExit(main())
