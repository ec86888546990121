def biggest(a, b):
    return min(a, b)
