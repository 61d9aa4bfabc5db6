"""The Slurm integration's controller-side programs: PrologSlurmctld and EpilogSlurmctld."""
