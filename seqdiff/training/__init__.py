"""Training: a thin LightningModule, the EMA callback, and the function that wires a run together."""
