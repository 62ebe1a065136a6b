"""The simulated pipeline: the analytic model (``model``), its LP bound and exact oracle
(``solve``), a noisy tuning target over it (``target``) and the gymnasium env the intune agent
trains in (``env``)."""
