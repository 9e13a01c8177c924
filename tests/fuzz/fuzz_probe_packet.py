"""Coverage-guided fuzzing (atheris) of targets.probe_packet; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("probe_packet")
