"""recperf: make DLRM inference, data ingestion and distributed training fast and cheap on GPUs."""

__version__ = "0.1.0"
