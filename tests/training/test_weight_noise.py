import torch

from cbasr.training.weight_noise import noisy_parameters, weight_noise


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def _grads_at(model, x):
    model.zero_grad()
    model(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_gradient_at_the_noisy_weights_update_of_the_clean_ones():
    model, x = _model(), torch.randn(5, 4)
    clean = [p.detach().clone() for p in model.parameters()]
    params = noisy_parameters(model)
    assert [p.shape for p in params] == [(3, 4), (2, 3)]  # weight matrices; biases stay clean

    with weight_noise(params, 0.1, torch.Generator().manual_seed(7)):
        noisy = [p.detach().clone() for p in model.parameters()]
        grads = _grads_at(model, x)
    after = [p.detach().clone() for p in model.parameters()]
    assert all(torch.equal(a, c) for a, c in zip(after, clean))  # restored exactly

    g = torch.Generator().manual_seed(7)
    expected_noise = [0.1 * torch.randn(p.shape, generator=g) for p in params]
    torch.testing.assert_close(noisy[0], clean[0] + expected_noise[0])
    torch.testing.assert_close(noisy[2], clean[2] + expected_noise[1])
    assert torch.equal(noisy[1], clean[1]) and torch.equal(noisy[3], clean[3])  # biases

    reference = _model()  # the same weights, with the same noise written in by hand
    with torch.no_grad():
        for p, n in zip(reference.parameters(), noisy):
            p.copy_(n)
    for g_noise, g_ref in zip(grads, _grads_at(reference, x)):
        torch.testing.assert_close(g_noise, g_ref)

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for p, grad in zip(model.parameters(), grads):
        p.grad = grad
    opt.step()  # the clean weights move by the noisy gradient
    for p, c, grad in zip(model.parameters(), clean, grads):
        torch.testing.assert_close(p.detach(), c - 0.5 * grad)


def test_weights_are_restored_when_the_step_fails():
    model = _model()
    clean = [p.detach().clone() for p in model.parameters()]
    try:
        with weight_noise(noisy_parameters(model), 1.0, torch.Generator().manual_seed(1)):
            raise FloatingPointError
    except FloatingPointError:
        pass
    assert all(torch.equal(p, c) for p, c in zip(model.parameters(), clean))
