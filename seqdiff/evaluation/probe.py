"""Frozen-embedding probes for text backbones (the genomic benchmark protocol lives in seqdiff.probes):
how much a backbone's representations say about a label, with the backbone fixed.

    mean_pooled_features(backbone, ids, attention_mask)   (N, H) float64 features, no gradients
    logistic_probe(x_train, y_train, x_test, y_test)      scikit-learn logistic regression, test accuracy

Design choices
- Features are the backbone's `hidden_states` (the last layer), averaged over the real tokens of each
  sequence (padding excluded): the usual sentence-embedding pooling, and no trained parameters of its own.
- The probe is a standardized, L2-regularized multinomial logistic regression whose strength C is chosen by
  cross-validation on the training split only (a linear probe: it measures what is linearly readable,
  not what a new network could learn on top).
- No noise level: the backbone sees clean text (a diffusion model's t -> 0 end).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seqdiff.probes.embeddings import masked_mean


@torch.no_grad()
def mean_pooled_features(backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                         batch_size: int = 32) -> np.ndarray:
    """(N, L) token ids -> (N, H) mean of the last hidden states over real tokens, in float64."""
    was_training = backbone.training
    backbone.eval()
    device = next(backbone.parameters()).device
    out = []
    for start in range(0, input_ids.shape[0], batch_size):
        ids = input_ids[start:start + batch_size].to(device)
        mask = None if attention_mask is None else attention_mask[start:start + batch_size].to(device).bool()
        h = backbone.hidden_states(ids, None, mask).double()  # (B, L, H)
        real = torch.ones(ids.shape, dtype=torch.bool, device=device) if mask is None else mask
        out.append(masked_mean(h, real).cpu())
    backbone.train(was_training)
    return torch.cat(out).numpy()


def logistic_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                   Cs: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0), folds: int = 5, seed: int = 0) -> dict[str, Any]:
    """Fit standardize + logistic regression (C by stratified cross-validation on train); accuracy on test.

    The scaler is refit inside every fold, so the held-out fold never informs the standardization.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    search = GridSearchCV(model, {"logisticregression__C": list(Cs)}, scoring="accuracy",
                          cv=StratifiedKFold(folds, shuffle=True, random_state=seed))
    search.fit(x_train, y_train)
    pred = search.predict(x_test)
    return {"accuracy": float(np.mean(pred == y_test)),
            "balanced_accuracy": float(balanced_accuracy_score(y_test, pred)),
            "C": float(search.best_params_["logisticregression__C"]), "n_train": int(len(y_train)),
            "n_test": int(len(y_test)), "correct": (pred == y_test).tolist()}


__all__ = ["logistic_probe", "mean_pooled_features"]
