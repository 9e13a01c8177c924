"""Coverage-guided fuzzing (atheris) of targets.engine_spans, the engine through its
binding; see README.md."""

from atheris_main import main_native

if __name__ == "__main__":
    main_native("engine_spans")
