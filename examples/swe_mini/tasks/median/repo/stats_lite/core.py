def mean(values):
    values = list(values)
    if not values:
        raise ValueError("mean() of an empty sequence")
    return sum(values) / len(values)


def median(values):
    values = sorted(values)
    if not values:
        raise ValueError("median() of an empty sequence")
    return values[len(values) // 2]
