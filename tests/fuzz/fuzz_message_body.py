"""Coverage-guided fuzzing (atheris) of targets.message_body; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("message_body")
