"""Cell signalling and metabolism: published kinetic models of the PEtab benchmark collection,
written from their SBML files (experiments/data/petab/), states in concentrations, time in the
units of the publication. Their studies (data, observables, unknowns) are in
experiments/bench/_studies.py."""

import jax.numpy as jnp
from jaxtyping import Array

import diffsim as ds


class BoehmSTAT5(ds.AbstractODE):
    """STAT5A/STAT5B dimerisation, phosphorylation and nuclear shuttling after erythropoietin
    (Epo) stimulation (J. Boehm et al., *J. Proteome Res.* 13, 5685 (2014)).

    Epo decays as 1.25e-7 exp(−Epo_degradation_BaF3 · t); phosphorylation forms the dimers
    pApA, pApB, pBpB in the cytoplasm (volume 1.4), which are imported into the nucleus
    (volume 0.45) and exported as monomers. Mass-action rates from the SBML model; time in
    minutes. State `[STAT5A, STAT5B, pApB, pApA, pBpB, nucpApA, nucpApB, nucpBpB]`; the initial
    state is `initial_state()` (207.6 · ratio of STAT5A, the rest STAT5B).
    """

    Epo_degradation_BaF3: Array = ds.parameter(0.0269738286367359, positive=True, ndim=0)
    k_exp_hetero: Array = ds.parameter(1.00094251286741e-05, positive=True, ndim=0)
    k_exp_homo: Array = ds.parameter(0.00617193081581346, positive=True, ndim=0)
    k_imp_hetero: Array = ds.parameter(0.0163708512310568, positive=True, ndim=0)
    k_imp_homo: Array = ds.parameter(96945.5391768823, positive=True, ndim=0)
    k_phos: Array = ds.parameter(15766.8336642826, positive=True, ndim=0)
    ratio: Array = ds.parameter(0.693, ndim=0)
    specC17: Array = ds.parameter(0.107, ndim=0)

    state_names = ("STAT5A", "STAT5B", "pApB", "pApA", "pBpB", "nucpApA", "nucpApB", "nucpBpB")

    def initial_state(self):
        total = 207.6
        zero = jnp.zeros((), jnp.result_type(self.ratio))
        return jnp.stack([total * self.ratio, total - total * self.ratio] + [zero] * 6)

    def vector_field(self, t, y, args=None):
        a, b, papb, papa, pbpb, npapa, npapb, npbpb = y
        cyt, nuc = 1.4, 0.45
        epo = 1.25e-7 * jnp.exp(-self.Epo_degradation_BaF3 * t)
        v1 = cyt * epo * a**2 * self.k_phos
        v2 = cyt * epo * a * b * self.k_phos
        v3 = cyt * epo * b**2 * self.k_phos
        v4 = cyt * self.k_imp_homo * papa
        v5 = cyt * self.k_imp_hetero * papb
        v6 = cyt * self.k_imp_homo * pbpb
        v7 = nuc * self.k_exp_homo * npapa
        v8 = nuc * self.k_exp_hetero * npapb
        v9 = nuc * self.k_exp_homo * npbpb
        return jnp.stack(
            [
                (-2 * v1 - v2 + 2 * v7 + v8) / cyt,
                (-v2 - 2 * v3 + v8 + 2 * v9) / cyt,
                (v2 - v5) / cyt,
                (v1 - v4) / cyt,
                (v3 - v6) / cyt,
                (v4 - v7) / nuc,
                (v5 - v8) / nuc,
                (v6 - v9) / nuc,
            ]
        )


class FujitaAkt(ds.AbstractODE):
    """EGF receptor → Akt → S6 signalling under EGF stimulation (K. A. Fujita et al.,
    *Sci. Signal.* 3, ra56 (2010)).

    EGF is `EGF_rate · t + EGF_0` until `EGF_end`, then 0 (steps, pulses and ramps of the
    publication's conditions). Mass-action rates from the SBML model (one compartment of
    volume 1); time in seconds. State `[EGFR, pEGFR, pEGFR_Akt, Akt, pAkt, S6, pAkt_S6, pS6,
    EGF_EGFR]`; the initial state is `initial_state()` (EGFR, Akt and S6 at their `init_*`
    values, the rest 0).
    """

    EGFR_turnover: Array = ds.parameter(0.001449799125736, positive=True, ndim=0)
    init_AKT: Array = ds.parameter(0.00332683237159935, positive=True, ndim=0)
    init_EGFR: Array = ds.parameter(22650805.5977911, positive=True, ndim=0)
    init_S6: Array = ds.parameter(205.86301335244, positive=True, ndim=0)
    reaction_1_k1: Array = ds.parameter(0.00372345533395159, positive=True, ndim=0)
    reaction_1_k2: Array = ds.parameter(0.00262709856442467, positive=True, ndim=0)
    reaction_2_k1: Array = ds.parameter(0.00103236148008131, positive=True, ndim=0)
    reaction_2_k2: Array = ds.parameter(41469.6914053245, positive=True, ndim=0)
    reaction_3_k1: Array = ds.parameter(0.454840577578597, positive=True, ndim=0)
    reaction_4_k1: Array = ds.parameter(0.0308146966905863, positive=True, ndim=0)
    reaction_5_k1: Array = ds.parameter(2.9643709900602e-06, positive=True, ndim=0)
    reaction_5_k2: Array = ds.parameter(0.000404055756190126, positive=True, ndim=0)
    reaction_6_k1: Array = ds.parameter(9.20585474645043e-06, positive=True, ndim=0)
    reaction_7_k1: Array = ds.parameter(0.0119329694583145, positive=True, ndim=0)
    reaction_8_k1: Array = ds.parameter(0.000941161525754959, positive=True, ndim=0)
    reaction_9_k1: Array = ds.parameter(0.0273281571867514, positive=True, ndim=0)
    EGF_0: Array = ds.parameter(0.0, ndim=0)
    EGF_rate: Array = ds.parameter(0.0, ndim=0)
    EGF_end: Array = ds.parameter(0.0, ndim=0)

    state_names = ("EGFR", "pEGFR", "pEGFR_Akt", "Akt", "pAkt", "S6", "pAkt_S6", "pS6", "EGF_EGFR")

    def initial_state(self):
        zero = jnp.zeros((), jnp.result_type(self.init_EGFR))
        return jnp.stack(
            [self.init_EGFR, zero, zero, self.init_AKT, zero, self.init_S6, zero, zero, zero]
        )

    def vector_field(self, t, y, args=None):
        egfr, pegfr, pegfr_akt, akt, pakt, s6, pakt_s6, ps6, egf_egfr = y
        egf = jnp.where(t <= self.EGF_end, self.EGF_rate * t + self.EGF_0, 0.0)
        v1 = egf * egfr * self.reaction_1_k1 - egf_egfr * self.reaction_1_k2
        v2 = akt * pegfr * self.reaction_2_k1 - pegfr_akt * self.reaction_2_k2
        v3 = pegfr_akt * self.reaction_3_k1
        v4 = pegfr * self.reaction_4_k1
        v5 = s6 * pakt * self.reaction_5_k1 - pakt_s6 * self.reaction_5_k2
        v6 = pakt_s6 * self.reaction_6_k1
        v7 = pakt * self.reaction_7_k1
        v8 = ps6 * self.reaction_8_k1
        v9 = egf_egfr * self.reaction_9_k1
        v10 = egfr * self.EGFR_turnover
        v11 = 68190 * self.EGFR_turnover
        return jnp.stack(
            [
                -v1 - v10 + v11,
                -v2 + v3 - v4 + v9,
                v2 - v3,
                -v2 + v7,
                v3 - v5 + v6 - v7,
                -v5 + v8,
                v5 - v6,
                v6 - v8,
                v1 - v9,
            ]
        )


class BrunoCarotenoids(ds.AbstractODE):
    """Carotenoid cleavage in Arabidopsis: β-carotene, β-cryptoxanthin and zeaxanthin to
    apocarotenoids (M. Bruno et al., *J. Exp. Bot.* 67, 5993 (2016)).

    First-order reactions whose rates are `k · k_multiplier`: the multipliers switch
    reactions on and off (or scale them) per experimental condition. Time in minutes. State
    `[bcar, bcry, b10, bio, ohb10, ohbio, zea]`; the initial state is `initial_state()` (the
    `init_*` values, bio and ohbio 0).
    """

    k5: Array = ds.parameter(0.003086673219173, positive=True, ndim=0)
    kb1: Array = ds.parameter(0.016628409992721, positive=True, ndim=0)
    kb2: Array = ds.parameter(0.005843831819271, positive=True, ndim=0)
    kc1: Array = ds.parameter(0.001678825242274, positive=True, ndim=0)
    kc2: Array = ds.parameter(0.006975989070463, positive=True, ndim=0)
    kc4: Array = ds.parameter(0.006082700899195, positive=True, ndim=0)
    k5_multiplier: Array = ds.parameter(1.0, ndim=0)
    kb1_multiplier: Array = ds.parameter(1.0, ndim=0)
    kb2_multiplier: Array = ds.parameter(1.0, ndim=0)
    kc1_multiplier: Array = ds.parameter(1.0, ndim=0)
    kc2_multiplier: Array = ds.parameter(1.0, ndim=0)
    kc4_multiplier: Array = ds.parameter(1.0, ndim=0)
    init_bcar: Array = ds.parameter(1.0, ndim=0)
    init_bcry: Array = ds.parameter(0.0, ndim=0)
    init_b10: Array = ds.parameter(0.0, ndim=0)
    init_ohb10: Array = ds.parameter(0.0, ndim=0)
    init_zea: Array = ds.parameter(0.0, ndim=0)

    state_names = ("bcar", "bcry", "b10", "bio", "ohb10", "ohbio", "zea")

    def initial_state(self):
        zero = jnp.zeros((), jnp.result_type(self.init_bcar))
        return jnp.stack(
            [
                self.init_bcar,
                self.init_bcry,
                self.init_b10,
                zero,
                self.init_ohb10,
                zero,
                self.init_zea,
            ]
        )

    def vector_field(self, t, y, args=None):
        bcar, bcry, b10, bio, ohb10, ohbio, zea = y
        v1 = bcar * self.kb1 * self.kb1_multiplier
        v2 = b10 * self.kb2 * self.kb2_multiplier
        v3 = bcry * self.kc1 * self.kc1_multiplier
        v4 = bcry * self.kc2 * self.kc2_multiplier
        v5 = ohb10 * self.kc4 * self.kc4_multiplier
        v6 = zea * self.k5 * self.k5_multiplier
        return jnp.stack(
            [-v1, -v3 - v4, v1 - v2 + v3, v1 + v2 + v4, v4 - v5 + v6, v3 + v5 + v6, -v6]
        )
