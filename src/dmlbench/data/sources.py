"""Where ``dmlbench data fetch`` downloads the real datasets from, the sums it checks, and each
dataset's terms and citation (docs/datasets.md says where every sum comes from).

A file with no published sha256 carries what is published (an md5) or nothing: its sha256 is then
recorded on first use (``ROOT/.dmlbench-downloads/NAME.sha256``) and every later download is checked
against that record; the command says so when it happens."""

from __future__ import annotations

from dataclasses import dataclass

from dmlbench.download import Remote


@dataclass(frozen=True)
class Part:
    """One downloaded file: unpacked into ``into`` (an archive) or placed at ``into`` (a plain file),
    relative to the staging folder whose ``Source.folder`` becomes the dataset."""

    remote: Remote
    into: str
    archive: bool


@dataclass(frozen=True)
class Source:
    folder: str  # the folder under --root that data.root names
    parts: tuple[Part, ...]
    terms: str
    citation: str
    # What to do when the files cannot be downloaded (a host that is gone), added to that error's line.
    when_unreachable: str = ""


SOURCES = {
    "cub200": Source(
        folder="CUB_200_2011",
        parts=(Part(Remote(
            "CUB_200_2011.tgz", "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1",
            # tensorflow/datasets url_checksums/caltech_birds2011.txt (1,150,585,339 bytes); the same in
            # torchvision's prototype cub200 dataset; md5 as torchvision-style CUB loaders pin it.
            sha256="0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081",
            md5="97eceeb196236b17998738112f37df78"), into="", archive=True),),
        terms="Caltech-UCSD Birds-200-2011: images from Flickr, their copyright stays with their photographers; "
              "for non-commercial research (the dataset's page and README)",
        citation="C. Wah, S. Branson, P. Welinder, P. Perona, S. Belongie. The Caltech-UCSD Birds-200-2011 "
                 "Dataset. Technical Report CNS-TR-2011-001, California Institute of Technology, 2011.",
    ),
    "cars196": Source(
        folder="cars196",
        # The official host (ai.stanford.edu/~jkrause, imagenet.stanford.edu/internal/car196) is gone; these
        # are the addresses the field's loaders used. Only md5 sums were ever published by those loaders.
        parts=(
            Part(Remote("car_ims.tgz", "http://imagenet.stanford.edu/internal/car196/car_ims.tgz",
                        md5="d5c8f0aa497503f355e17dc7886c3f14"), into="cars196", archive=True),
            Part(Remote("cars_annos.mat", "http://imagenet.stanford.edu/internal/car196/cars_annos.mat",
                        md5="b407c6086d669747186bd1d764ff9dbc"), into="cars196/cars_annos.mat", archive=False),
        ),
        terms="Stanford Cars: images from the web, their copyright stays with their owners; "
              "for non-commercial research (the dataset's page)",
        citation="J. Krause, M. Stark, J. Deng, L. Fei-Fei. 3D Object Representations for Fine-Grained "
                 "Categorization. 4th IEEE Workshop on 3D Representation and Recognition (3dRR-13), ICCV 2013.",
        when_unreachable="Cars196's original host is gone (torchvision #7545, tensorflow/datasets #4932): put "
                         "car_ims.tgz and cars_annos.mat from a copy in the original layout (a colleague, an archive) "
                         "in a folder and run this command with --mirror FOLDER (the md5 check tells whether they are "
                         "the originals); the Kaggle re-packaging pytorch-metric-learning uses has another layout "
                         "(docs/datasets.md)",
    ),
    "sop": Source(
        folder="Stanford_Online_Products",
        # The authors' Google Drive copy (linked from github.com/rksltnl/Deep-Metric-Learning-CVPR16, and
        # pytorch-metric-learning's download); the sum is tensorflow/datasets' of the same zip from
        # ftp://cs.stanford.edu/cs/cvgl/ (url_checksums/stanford_online_products.txt, 3,083,860,082 bytes).
        parts=(Part(Remote(
            "Stanford_Online_Products.zip",
            "https://drive.usercontent.google.com/download?id=1TclrpQOF_ullUP99wk_gjGN8pKvtErG8&export=download&confirm=t",
            sha256="b04fa78210e69fab050ce73939550e1cd0f96890bdd98ec9fee732c3b756ef48"), into="", archive=True),),
        terms="Stanford Online Products: eBay product images; the LICENSE file in the archive "
              "(research use)",
        citation="H. Oh Song, Y. Xiang, S. Jegelka, S. Savarese. Deep Metric Learning via Lifted Structured "
                 "Feature Embedding. CVPR 2016.",
    ),
    "inshop": Source(
        folder="inshop",
        # DeepFashion's own Google Drive (mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html):
        # no sum is published for either file, so both are trusted on first use.
        parts=(
            Part(Remote("img.zip", "https://drive.usercontent.google.com/download?id=0B7EVK8r0v71pS2YxRE1QTFZzekU"
                                   "&resourcekey=0-2n-dbZygJiZdm0UbEaFRTA&export=download&confirm=t"),
                 into="inshop", archive=True),
            Part(Remote("list_eval_partition.txt",
                        "https://drive.usercontent.google.com/download?id=0B7EVK8r0v71pYVBqLXpRVjhHeWM"
                        "&resourcekey=0-rxJ2QcImN-IRo_Bv9QSXmg&export=download&confirm=t"),
                 into="inshop/list_eval_partition.txt", archive=False),
        ),
        terms="DeepFashion In-shop Clothes Retrieval: for non-commercial research and educational purposes "
              "only (the DeepFashion agreement)",
        citation="Z. Liu, P. Luo, S. Qiu, X. Wang, X. Tang. DeepFashion: Powering Robust Clothes Recognition "
                 "and Retrieval with Rich Annotations. CVPR 2016.",
    ),
}
