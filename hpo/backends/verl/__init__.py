"""Real verl as a trial backend (``python -m verl.trainer.main_ppo`` in verl's interpreter): ``_launch`` builds a
trial's argv, environment and resume point; ``_compose`` runs inside verl's interpreter to compose and check
configs; ``_data`` is the shipped data's prepare step.

May import: ``hpo.experiment``, ``hpo.execution``, ``hpo.analysis``."""
