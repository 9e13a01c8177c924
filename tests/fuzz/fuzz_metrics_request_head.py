"""Coverage-guided fuzzing (atheris) of targets.metrics_request_head; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("metrics_request_head")
