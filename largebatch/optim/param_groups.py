# TEMPORARY placeholder until the param_groups module lands; not committed.
import fnmatch


def build_param_groups(model, *, weight_decay, no_weight_decay=(), exclude_1d=True, layer_decay=None):
    decay, no_decay, dn, nn_ = [], [], [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if (exclude_1d and p.ndim <= 1) or any(fnmatch.fnmatch(n, pat) for pat in no_weight_decay):
            no_decay.append(p)
            nn_.append(n)
        else:
            decay.append(p)
            dn.append(n)
    return [
        dict(params=decay, weight_decay=weight_decay, name="decay", param_names=dn),
        dict(params=no_decay, weight_decay=0.0, name="no_decay", param_names=nn_),
    ]
