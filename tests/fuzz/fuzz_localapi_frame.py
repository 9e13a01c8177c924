"""Coverage-guided fuzzing (atheris) of targets.localapi_frame; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("localapi_frame")
