"""Quality of generated 8x8 digits: a classifier two-sample test and the digit classes covered.

    metric = DigitQuality()        # splits the digits, fits the classifier, measures the floor
    metric(samples)                -> {"c2st_accuracy", "c2st_floor", "c2st_samples",
                                       "classes_covered", "class_entropy", "class_histogram"}

scikit-learn's 1797 digits are split into two class-stratified halves (fixed ``seed``;
``fastgp.train.data.digit_split``). A digit classifier (RBF SVM) is fitted on the first half
(98.3 % accurate on the second); the second half is the held-out real reference of the
two-sample test. ``fastgp train --dataset digits`` trains on the first half only
(``load_digits(split="train")``, the split of seed 0), so with the default ``seed`` the reference
is digits the generator never saw (a copy of its training set scores the floor).

Classifier two-sample test (C2ST, Lopez-Paz & Oquab 2017): the first n samples (n = the held-out
half, 898) labelled 0 and the held-out digits labelled 1; the reported accuracy is the 2-fold
cross-validated accuracy of an RBF SVM told to separate them. 0.5: indistinguishable; 1.0: every
sample told apart. ``c2st_floor`` is the same test with the classifier's half in place of the
samples (real vs real): what a perfect generator scores (0.47-0.52 over seeds 0-4).
The kernel width is fixed from the real digits, so every evaluation uses the same test.

Coverage: the digit classifier's labels of all samples: ``class_histogram`` (10 counts),
``class_entropy`` (entropy / log 10: 1 uniform, 0 one class) and ``classes_covered`` (classes with
at least 2.5 % of the samples, a quarter of a uniform share). Noise is spread over many classes by
the classifier, so coverage alone does not rank noise: the C2ST does.
"""

import numpy as np

PIXELS = 64
CLASSES = 10
COVERED_SHARE = 0.25 / CLASSES


def _svm(gamma):
    from sklearn.svm import SVC

    return SVC(kernel="rbf", gamma=gamma)


class DigitQuality:
    """The digits metric; call it on (N, 8, 8, 1) or (N, 64) samples in [-1, 1], N >= n_samples."""

    def __init__(self, seed: int = 0):
        from fastgp.train.data import digit_labels, digit_split, load_digits

        images = load_digits().reshape(-1, PIXELS)  # float32 in [-1, 1]
        first, held_out = digit_split(seed)
        self.seed = seed
        self.train_index, self.held_out_index = first, held_out  # rows of load_digits()
        self.train_images = images[first]
        self.held_out = images[held_out]
        self.n_samples = len(held_out)
        self.gamma = 1.0 / (PIXELS * float(images.var()))  # sklearn's "scale", real data only
        self.classifier = _svm(self.gamma).fit(images[first], digit_labels()[first])
        self.floor = self.c2st(self.train_images[: self.n_samples])

    def c2st(self, samples) -> float:
        """2-fold cross-validated accuracy of an RBF SVM separating ``samples`` (n, 64) from the
        held-out digits (n = ``n_samples``)."""
        from sklearn.model_selection import StratifiedKFold, cross_val_score

        both = np.concatenate([samples, self.held_out])
        labels = np.r_[np.zeros(len(samples)), np.ones(len(self.held_out))]
        folds = StratifiedKFold(2, shuffle=True, random_state=self.seed)
        return float(np.mean(cross_val_score(_svm(self.gamma), both, labels, cv=folds)))

    def __call__(self, samples) -> dict:
        """The metric of ``samples`` (generator output in data coordinates); JSON-ready values."""
        flat = np.asarray(samples, np.float32)
        flat = flat.reshape(flat.shape[0], -1) if flat.ndim else flat
        if flat.ndim != 2 or flat.shape[1] != PIXELS:
            raise ValueError(
                f"samples must be (N, 8, 8, 1) or (N, 64) digits, got {np.shape(samples)}"
            )
        if flat.shape[0] < self.n_samples:
            raise ValueError(
                f"the digits metric needs at least {self.n_samples} samples (the "
                f"held-out half), got {flat.shape[0]}"
            )
        if not np.all(np.isfinite(flat)):
            raise ValueError(
                f"{int(np.sum(~np.all(np.isfinite(flat), 1)))} of {flat.shape[0]} "
                f"samples are not finite"
            )
        counts = np.bincount(self.classifier.predict(flat), minlength=CLASSES)
        share = counts / counts.sum()
        entropy = -np.sum(share[share > 0] * np.log(share[share > 0])) / np.log(CLASSES)
        return {
            "c2st_accuracy": round(self.c2st(flat[: self.n_samples]), 4),
            "c2st_floor": round(self.floor, 4),
            "c2st_samples": self.n_samples,
            "classes_covered": int(np.sum(share >= COVERED_SHARE)),
            "class_entropy": round(float(entropy) + 0.0, 4),
            "class_histogram": [int(c) for c in counts],
        }


__all__ = ["DigitQuality"]
