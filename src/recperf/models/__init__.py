"""Models shared by more than one capability (the DLRM used for training and for inference)."""
