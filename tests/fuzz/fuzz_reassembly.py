"""Coverage-guided fuzzing (atheris) of targets.reassembly; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("reassembly")
