"""Several ``headrace serve`` nodes acting as one service."""
