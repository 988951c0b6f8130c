"""analyses"""
__all__: list[str] = []
