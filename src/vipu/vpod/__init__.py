"""`vipu-vpod`: the site's orchestration of tenant vPODs (seed 003).

It keeps the site's IPU-Machines and which vPOD holds each, and for each tenant's vPOD starts a
dedicated, secure `vipu-server`, hands it the machines (their agents obey one controller; the
orchestrator holds the site's agent-link authority, which hands them over), and creates the
tenant's cluster, allocation and first user. Releasing takes everything back, clean.
"""
