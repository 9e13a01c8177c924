"""The benchmark runner: real gateways in the WAN lab, timed trainers, baselines, records.

    python -m bench run SCENARIO [SCENARIO ...] | all [--runs N] [--tree REV]

``cli.py`` is the command and its rounds over trees; ``run.py`` drives one scenario
(lab, gateways, trainers, monitor, baselines); ``gateways.py`` starts the sites'
gateways of a tree and waits for their paths (every lab benchmark starts them so);
``trainer.py`` is the process that sends or receives one flow inside a site;
``monitor.py`` samples every gateway's path table and reads route changes from its log;
``record.py`` turns the raw samples into per-second series and the Markdown summary;
``budget.py`` splits a run's link capacity into where it went; ``plots.py`` draws it;
``baselines.py`` and ``transfer.py`` replay the workload over TCP cubic, TCP BBR and a
plain aioquic stream in the same lab.
"""
