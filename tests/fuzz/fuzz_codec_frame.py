"""Coverage-guided fuzzing (atheris) of targets.codec_frame; see README.md."""

from atheris_main import main

if __name__ == "__main__":
    main("codec_frame")
