"""reports"""
__all__: list[str] = []
