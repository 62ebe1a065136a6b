"""DLRM training-data ingestion: Criteo-format data generation and streaming readers."""
