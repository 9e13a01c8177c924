"""Coverage-guided fuzzing (atheris) of targets.config_file; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("config_file")
