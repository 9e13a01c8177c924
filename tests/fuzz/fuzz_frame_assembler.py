"""Coverage-guided fuzzing (atheris) of targets.frame_assembler; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("frame_assembler")
