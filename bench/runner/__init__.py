"""The benchmark runner: real gateways in the WAN lab, timed trainers, baselines, records.

    python -m bench run SCENARIO [SCENARIO ...] | all [--runs N] [--tree REV]

``run.py`` drives one scenario (lab, gateways, trainers, monitor, baselines);
``trainer.py`` is the process that sends or receives one flow inside a site;
``monitor.py`` samples every gateway's path table and reads route changes from its log;
``record.py`` turns the raw samples into per-second series and the Markdown summary.
"""
