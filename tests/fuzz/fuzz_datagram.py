"""Coverage-guided fuzzing (atheris) of targets.datagram; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("datagram")
