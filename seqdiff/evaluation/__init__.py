"""Evaluation: likelihoods (NELBO bounds for diffusion, exact NLL for AR) and sample generation."""
