"""The cloud cost advisor: instance and GPU tables (``table``, ``catalog``, ``skypilot``) and
the advice over them (``advisor``)."""
