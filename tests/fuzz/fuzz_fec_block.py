"""Coverage-guided fuzzing (atheris) of targets.fec_block; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("fec_block")
