"""The coordinator: device registry, versioned global model, aggregation strategies, daemon runtime.

Import the pieces from their modules (``streamfl.coordinator.core``, ``.server``...): this package
file stays light so ``streamfl-coordinator --help`` and config errors answer without loading torch.
"""
