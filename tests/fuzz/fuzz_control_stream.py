"""Coverage-guided fuzzing (atheris) of targets.control_stream; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("control_stream")
